"""Stage 1, correctness: the tests marked ``gpu`` (pytest -m gpu, a subprocess), counted: the fused kernel against
float64 in float32, bfloat16 and float16, partial, with the residual add, past 2**31 elements; the model with the
fused norm against the one with PyTorch's; a resume on the GPU to the uninterrupted losses; SDPA's flash backend."""

from __future__ import annotations

import os
import re
import sys

from lab.gpu_check.stage import ROOT, CheckFailed, OutOfTime, Stage, error_line, run_at_once

OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "with errors", "SKIPPED": "skipped"}


def gpu_test_files() -> list[str]:
    """The test files that mark tests ``gpu``: collecting only these keeps other files' packages (the browser
    tests') out of a GPU machine's run."""
    files = (ROOT / "tests").rglob("test_*.py")
    return sorted(str(path.relative_to(ROOT)) for path in files if "mark.gpu" in path.read_text())


def correctness(stage: Stage) -> None:
    if stage.dry_run:  # one test that runs here, one that needs a GPU and is skipped
        selection = ["-n", "0", "tests/unit/norms/test_fused.py", "-k", "interpreter_backend or more_than_2_31"]
    else:  # Triton compiles each kernel variant on a CPU core: a worker per two cores, tests spread one by one
        workers = max(1, min(8, (os.cpu_count() or 2) // 2))
        selection = ["-n", str(workers), "--dist", "load", "-m", "gpu", *gpu_test_files()]
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *selection]
    try:
        ((code, output),) = run_at_once(stage, {"pytest": command}).values()
    except OutOfTime:
        count_tests(stage, (stage.scratch / f"{stage.name}-pytest.log").read_text())  # the tests that finished
        raise
    outcomes, reasons, broken_files = count_tests(stage, output)
    if broken_files:
        raise CheckFailed(f"{len(broken_files)} test file(s) did not import: {next(iter(broken_files.items()))}")
    if not outcomes:
        raise CheckFailed(f"pytest ran no test (exit {code}): {error_line(output)}")
    failed = [test for test, outcome in outcomes.items() if outcome in ("FAILED", "ERROR")]
    if failed:
        raise CheckFailed(f"{len(failed)} of {len(outcomes)} failed, first {failed[0]}: {reasons.get(failed[0], '')}")


def count_tests(stage: Stage, output: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Each test's outcome from pytest -v's lines (with or without xdist), recorded as numbers; the failures'
    one-line reasons; files that did not import."""
    outcomes = {}
    for line in output.splitlines():
        test, outcome = re.search(r"\S+::\S+", line), re.search(rf"\b({'|'.join(OUTCOMES)})\b", line)
        if test and outcome:
            outcomes[test.group()] = outcome.group(1)
    reasons = dict(re.findall(r"^(?:FAILED|ERROR) (\S+::\S+) - (.*)$", output, re.MULTILINE))
    broken_files = dict(re.findall(r"^ERROR (\S+\.py)(?: - (.*))?$", output, re.MULTILINE))
    stage.numbers.clear()
    for outcome, label in OUTCOMES.items():
        count = sum(o == outcome for o in outcomes.values())
        ratio = count / len(outcomes) if outcomes else None
        stage.number(f"tests {label}", count, "tests", f"tests run: {len(outcomes)}", ratio)
    stage.progress = f"{len(outcomes)} tests had finished"
    return outcomes, reasons, broken_files
