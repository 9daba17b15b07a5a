"""CLI: ingest/info/synth through CliRunner and a real subprocess; errors are one clear line, exit code != 0."""
import json
import subprocess
import sys

from typer.testing import CliRunner

from cli.main import app


def test_synth_ingest_info_json(tmp_path):
    r = CliRunner().invoke(app, ["synth", str(tmp_path / "s.svm"), "--rows", "300", "--features", "5000",
                                 "--nnz-per-row", "30", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["rows"] == 300 and s["bytes"] == (tmp_path / "s.svm").stat().st_size
    r = CliRunner().invoke(app, ["ingest", str(tmp_path / "s.svm"), "--out", str(tmp_path / "st"), "--block-mb",
                                 "0.01", "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    ing = json.loads(r.stdout)
    assert {"n_rows", "n_features", "nnz", "n_blocks", "holdout_blocks", "seconds", "bytes_read"} <= set(ing)
    assert ing["n_rows"] == 300 and ing["nnz"] == s["nnz"] and ing["holdout_blocks"] >= 1
    r = CliRunner().invoke(app, ["info", str(tmp_path / "st"), "--json"])
    info = json.loads(r.stdout)
    assert r.exit_code == 0 and info["n_rows"] == 300 and sum(info["label_counts"].values()) == 300
    assert 0 < info["density"] < 1 and info["compression_ratio"] > 0 and info["bytes_on_disk"] > 0
    assert {"+1", "-1"} == set(info["label_counts"])


def test_ingest_error_is_one_line_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.svm"
    bad.write_text("+1 1:1\n-1 2:1 2:3\n")
    r = subprocess.run([sys.executable, "-m", "cli.main", "ingest", str(bad), "--out", str(tmp_path / "s"),
                        "--workers", "1"], capture_output=True, text=True)
    assert r.returncode == 1 and "bad.svm:2:" in r.stderr and "duplicate" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "s").exists()


def test_help_explains_every_command():
    for cmd in ("ingest", "info", "synth", "train", "evaluate", "predict"):
        r = CliRunner().invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Usage" in r.output
