# Two set-up commands: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := demo-out

.PHONY: demo test bench clean venv device-wheels

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed-test
	$(BIN)/python -m pip install -q -e ".[test,bench]" || $(BIN)/python -m pip install -q -e ".[test]" scikit-learn
	touch $@

venv: $(VENV)/.installed-test

# Whole test suite; pytest's exit code 5 (no tests collected) is turned into a failure.
test: $(VENV)/.installed-test
	@$(BIN)/python -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "error: no tests collected"; exit 1; fi; exit $$rc

# Main job end to end on a generated webspam-like file and an embedded local cluster.
demo: $(VENV)/.installed-test
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(BIN)/sparsepipe synth $(DEMO)/webspam_like.svm --rows 20000 --features 200000 --nnz-per-row 200 --seed 1
	$(BIN)/sparsepipe ingest $(DEMO)/webspam_like.svm --out $(DEMO)/store.zarr --block-mb 2 --workers 2
	$(BIN)/sparsepipe info $(DEMO)/store.zarr
	$(BIN)/sparsepipe train $(DEMO)/store.zarr --out $(DEMO)/model.npz --config configs/demo.toml --workers 2
	$(BIN)/sparsepipe evaluate $(DEMO)/model.npz $(DEMO)/store.zarr --split holdout
	# two nights of scheduled retraining (docs/nightly.md): night 2 warm-starts from night 1 and shows the gate
	for n in 1 2; do $(BIN)/sparsepipe synth $(DEMO)/night$$n.svm --rows 5000 --features 200000 --nnz-per-row 200 \
	  --seed 1$$n --model-seed 1 && $(BIN)/sparsepipe retrain --config configs/nightly.toml --new $(DEMO)/night$$n.svm \
	  --store $(DEMO)/nightly/store.zarr --registry $(DEMO)/nightly/models --workers 2 || exit 1; done
	$(BIN)/sparsepipe registry list $(DEMO)/nightly/models

bench: $(VENV)/.installed-bench
	$(BIN)/python -m benchmarks.run_all

# Wheels of the dependencies the device machine's image lacks (CPython 3.12, x86-64; it reaches no registry), the
# versions tested here; benchmarks/device_scaling.sh installs them there.
DEVICE_WHEELS := dask==2026.8.0 distributed==2026.8.0 zarr==3.1.6 numcodecs==0.16.6 sparse==0.19.3 \
	donfig==0.8.1.post1 google-crc32c==1.9.0 partd==1.4.2 locket==1.0.0 tblib==3.2.2 zict==3.0.0 tornado==6.6.1 \
	importlib_metadata==10.2.0 typer==0.28.0
device-wheels: | $(BIN)/python
	rm -rf .whl
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(DEVICE_WHEELS)

clean:
	rm -rf $(DEMO) .pytest_cache
