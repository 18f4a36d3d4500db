"""`benchmarks.figures`: every benchmark figure in README.md and docs/ is the one its JSON gives."""

import json
import shutil

import pytest

from benchmarks import figures

RESULTS = figures.ROOT / figures.RESULTS


def test_readme_and_docs_agree_with_the_results():
    problems = figures.check()
    assert not problems, "\n".join(problems) + "\nRun `python -m benchmarks.figures` and commit the result."


def test_every_result_file_is_read_by_a_region_and_every_region_is_used():
    read = {name for names in figures.SOURCES.values() for name in names}
    assert set(figures.SOURCES) == set(figures.REGIONS)
    # --tiny runs (suite_*_tiny.json) check the machinery only; no document cites them.
    assert read == {path.name for path in RESULTS.glob("*.json") if not path.name.endswith("_tiny.json")}
    used = {name for path in figures.documents(figures.ROOT)
            for name, _, _ in figures.regions((figures.ROOT / path).read_text(), path)}
    assert used == set(figures.REGIONS)


@pytest.fixture
def repo(tmp_path):
    """A repository of one README and the real results."""
    shutil.copytree(RESULTS, tmp_path / figures.RESULTS)
    (tmp_path / "docs").mkdir()
    return tmp_path


def test_check_names_the_stale_region_and_rewrite_mends_it(repo):
    readme = repo / "README.md"
    readme.write_text("# x\n\n<!-- figures:main-job -->\nmean 12.34%\n<!-- /figures:main-job -->\n\nafter\n")
    assert figures.check(repo) == ["README.md: region 'main-job' is out of date (python -m benchmarks.figures)"]
    assert figures.main(["--check", f"--root={repo}"]) == 1
    assert figures.main([f"--root={repo}"]) == 0
    text = readme.read_text()
    assert figures.check(repo) == [] and text.endswith("<!-- /figures:main-job -->\n\nafter\n")
    summary = json.loads((repo / figures.RESULTS / "main_job_seeds.json").read_text())["summary"]
    # main_job_seeds.json's summary, as main_job_seeds.py writes it
    assert f"mean {summary['mean']:.2%}, range {summary['min']:.2%}-{summary['max']:.2%}" in text
    assert figures.rewrite(repo) == []  # a second rewrite changes nothing


def test_a_figure_follows_its_json(repo):
    (repo / "docs" / "performance.md").write_text("<!-- figures:export-latency -->\n<!-- /figures:export-latency -->\n")
    figures.rewrite(repo)
    path = repo / figures.RESULTS / "export_latency_cpu.json"
    data = json.loads(path.read_text())
    saved = data["results"][1]  # Ti/16 saved_model
    ms, vs_keras = saved["latency_ms"], saved["vs_keras"]
    assert (f"| Ti/16 | saved_model | {ms['median']:.1f} ({ms['min']:.1f}-{ms['max']:.1f}) | "
            f"{vs_keras['median']:.2f} ({vs_keras['min']:.2f}-{vs_keras['max']:.2f}) | 1.00 (1.00-1.00) |"
            in (repo / "docs" / "performance.md").read_text())
    saved["latency_ms"]["median"] = ms["median"] + 13.2
    path.write_text(json.dumps(data))
    assert figures.check(repo) == ["docs/performance.md: region 'export-latency' is out of date "
                                   "(python -m benchmarks.figures)"]


def test_a_suite_run_under_xla_flags_says_so(repo):
    (repo / "docs" / "performance.md").write_text("<!-- figures:suite-gpu -->\n<!-- /figures:suite-gpu -->\n")
    figures.rewrite(repo)
    assert "XLA_FLAGS" not in (repo / "docs" / "performance.md").read_text()  # a run without them
    path = repo / figures.RESULTS / "suite_gpu_jax.json"
    data = json.loads(path.read_text())
    data["settings"]["xla_flags"] = "--xla_gpu_enable_triton_gemm=false"
    path.write_text(json.dumps(data))
    figures.rewrite(repo)
    assert "16 threads, `XLA_FLAGS=--xla_gpu_enable_triton_gemm=false`, 3 rounds" in (
        repo / "docs" / "performance.md").read_text()


@pytest.mark.parametrize("text, message", [
    ("<!-- figures:nope -->\n<!-- /figures:nope -->\n", "README.md:1: unknown region 'nope'"),
    ("<!-- figures:main-job -->\nx\n", "README.md: region 'main-job' is never closed"),
    ("x\n<!-- /figures:main-job -->\n", "README.md:2: '<!-- /figures:main-job -->' closes no open region"),
])
def test_broken_markers_are_named(repo, text, message):
    (repo / "README.md").write_text(text)
    (problem,) = figures.check(repo)
    assert problem.startswith(message)
    assert figures.main([f"--root={repo}"]) == 1


def test_a_figure_outside_a_region_is_refused(repo):
    (repo / "docs" / "guide.md").write_text("Steps are 1.16x slower, 12 ms per call and 3,027 MB.\n"
                                            "A 4096 x 4096 image, 8x8 digits, 1e-5: not figures.\n")
    assert figures.check(repo) == [f"docs/guide.md:1: '{figure}' is written outside a figures region"
                                   for figure in ("1.16x", "12 ms", "3,027 MB")]


def test_the_targets_table_follows_its_json(repo):
    (repo / "README.md").write_text("<!-- figures:targets -->\n<!-- /figures:targets -->\n")
    figures.rewrite(repo)

    def row(target):
        (line,) = [line for line in (repo / "README.md").read_text().splitlines() if line.startswith(f"| {target} |")]
        return [cell.strip() for cell in line.strip("|").split("|")]

    fp32 = "LiteRT fp32, Ti/16 batch 1 >= 2.5 x the SavedModel"
    path = repo / figures.RESULTS / "export_latency_cpu.json"
    data = json.loads(path.read_text())
    (speed_up,) = [r["speed_up_over_saved_model"] for r in data["results"]
                   if (r["variant"], r["runtime"]) == ("Ti/16", "tflite none")]
    # Four columns: target, measured, met, link.
    assert len(row(fp32)) == 4 and row(fp32)[3] == "[export latency](docs/performance.md#export-latency)"
    speed_up.update(median=2.6, min=2.2, max=2.9)  # met at the median, not in every round
    path.write_text(json.dumps(data))
    figures.rewrite(repo)
    assert row(fp32)[1:3] == ["2.60 (2.20-2.90)", "median only"]
    speed_up.update(min=2.5)
    path.write_text(json.dumps(data))
    figures.rewrite(repo)
    assert row(fp32)[1:3] == ["2.60 (2.50-2.90)", "yes"]

    limit = "B/16 inference batch 8 >= 0.90 of the matmul limit"
    path = repo / figures.RESULTS / "suite_cpu_jax.json"
    suite = json.loads(path.read_text())
    (target,) = [t for t in suite["targets"] if "fraction of matmul limit" in t["target"]]
    target.update(measured=0.5, met=False)
    path.write_text(json.dumps(suite))
    figures.rewrite(repo)
    assert row(limit)[1].endswith("JAX 0.50") and row(limit)[2] in ("no", "TF yes, JAX no")

    # Issue 44's runtime row: the four speed targets, then the memory one, each read once.
    runtimes = next(name for name, _, _ in figures.TARGETS if "ONNX Runtime" in name)
    path = repo / figures.RESULTS / "suite_cpu.json"
    suite = json.loads(path.read_text())
    for value, target in enumerate(t for t in suite["targets"] if "faster runtime" in t["target"]):
        target.update(measured=1.0 + value / 10, met=value < 4)  # the last, memory, misses its 1.2
    path.write_text(json.dumps(suite))
    figures.rewrite(repo)
    assert row(runtimes)[1:3] == ["1.00, 1.10, 1.20, 1.30; memory 1.40", "no"]


def test_a_targets_row_whose_json_lacks_it_is_named(repo):
    path = repo / figures.RESULTS / "suite_gpu_jax.json"
    suite = json.loads(path.read_text())
    suite["targets"] = []
    path.write_text(json.dumps(suite))
    (repo / "README.md").write_text("<!-- figures:targets -->\n<!-- /figures:targets -->\n")
    with pytest.raises(figures.FiguresError, match=r"suite_gpu_jax.json has no target matching"):
        figures.rewrite(repo)
