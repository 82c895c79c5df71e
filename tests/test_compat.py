"""Nothing a user has breaks: what an earlier release left on disk still loads, moved import paths
still work for a release, and every command the documentation shows still parses.

* **Artifacts** (``tests/data/compat/<commit>/``, one folder per release, each written by that
  release's own code with ``tests/data/compat/make_artifacts.py``, whose docstring says how): each
  rank's pickled ``DDPState`` from a 4-rank DDP run whose loop had switched to StragglAR, that run's
  event logs, and the JSON of both benches. The states load, hold the plan recorded next to them
  and resume it in a real DDP run whose gradients equal torch's ``all_reduce`` bit for bit on every
  rank; ``stragglerkit report`` reads the logs and the JSON and says what they recorded.
* **Moved import paths** (:data:`MOVED`): the old path gives the new object, with a
  ``DeprecationWarning``.
* **Documented commands**: every ``stragglerkit ...``, ``python -m stragglerkit...``,
  ``python examples/...`` and ``python profiling/...`` command in the Markdown files (code blocks and
  code spans; launchers such as torchrun stripped) answers ``--help``, and the ``stragglerkit``
  ones parse as written.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import html
import importlib
import io
import json
import os
import pickle
import re
import shlex
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _dist import run_group
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

REPO = Path(__file__).resolve().parents[1]
COMPAT = REPO / "tests" / "data" / "compat"
GENERATIONS = sorted(p for p in COMPAT.iterdir() if (p / "ddp_state.json").is_file())
"""One folder of artifacts per release (named by its commit)."""


def _recorded(generation: Path) -> dict[str, Any]:
    """What make_artifacts.py recorded about the states it pickled."""
    recorded: dict[str, Any] = json.loads((generation / "ddp_state.json").read_text())
    return recorded


def _generation_id(generation: Path) -> str:
    return generation.name


# -- moved import paths ---------------------------------------------------------------------------

MOVED: list[tuple[str, str, str]] = [
    # (old module, name, new module). When you move a public module or name, add one line per name
    # that users import, e.g.
    #     ("stragglerkit.report.records", "RecordLog", "stragglerkit.telemetry.records"),
    # The old module must stay importable for one release: ``from OLD import NAME`` has to warn with a
    # DeprecationWarning (when the module is imported or when the name is read, either will do) and
    # give the very object ``from NEW import NAME`` gives. Remove the line when the old path goes.
    ("stragglerkit.detect.plans", "Plan", "stragglerkit.plans"),
    ("stragglerkit.detect.plans", "Decision", "stragglerkit.plans"),
    ("stragglerkit.detect.plans", "WindowStats", "stragglerkit.plans"),
    ("stragglerkit.detect.plans", "log_path_for", "stragglerkit.plans"),
    ("stragglerkit.report.nvtx", "range", "stragglerkit.telemetry.nvtx"),
    ("stragglerkit.report.nvtx", "ALL_REDUCE", "stragglerkit.telemetry.nvtx"),
    ("stragglerkit.report.records", "RecordLog", "stragglerkit.telemetry.records"),
    ("stragglerkit.report.records", "window_record", "stragglerkit.telemetry.records"),
    ("stragglerkit.report.wandb", "WandbLogger", "stragglerkit.telemetry.wandb"),
    ("stragglerkit.report.wandb", "log_figures", "stragglerkit.telemetry.wandb"),
    ("stragglerkit.selective.bag", "bag", "stragglerkit.grouping.bag"),
    ("stragglerkit.selective.bpawr", "bpawr", "stragglerkit.grouping.bpawr"),
    ("stragglerkit.selective.config", "SelectiveConfig", "stragglerkit.grouping.config"),
    ("stragglerkit.selective.controller", "SelectiveReduceController", "stragglerkit.grouping.controller"),
    ("stragglerkit.selective.partial_reduce", "PartialReduceController", "stragglerkit.grouping.partial_reduce"),
    ("stragglerkit.selective.progress", "ProgressModel", "stragglerkit.grouping.progress"),
    ("stragglerkit.selective.workers", "WorkerReady", "stragglerkit.grouping.workers"),
    ("stragglerkit.runtime.policy", "choose_algorithm", "stragglerkit.planner.choice"),
    ("stragglerkit.runtime.policy", "optcc_situation", "stragglerkit.planner.policy"),
    ("stragglerkit.runtime.policy", "planned_situation", "stragglerkit.planner.policy"),
    ("stragglerkit.runtime.plan", "lower", "stragglerkit.planner.lowering"),
    ("stragglerkit.runtime.plan", "RankPlan", "stragglerkit.planner.lowering"),
    ("stragglerkit.runtime.rank_lowering", "one_rank_schedule", "stragglerkit.planner.rank_lowering"),
    ("stragglerkit.runtime.ordering", "in_round_order", "stragglerkit.planner.ordering"),
    ("stragglerkit.runtime.remap", "RankMap", "stragglerkit.planner.remap"),
    ("stragglerkit.sim.model_comparison", "MODELS", "stragglerkit.sim.cost_model"),
    ("stragglerkit.sim.model_comparison", "identifiable_params", "stragglerkit.sim.cost_model"),
    ("stragglerkit.sim.model_comparison", "compare", "stragglerkit.detect.model_comparison"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{old}.{name}" for old, name, _ in MOVED])
def test_moved_name_still_imports_from_its_old_path(old: str, name: str, new: str) -> None:
    expected = getattr(importlib.import_module(new), name)
    saved = sys.modules.pop(old, None)  # imported afresh, so that a warning at import time fires here
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = getattr(importlib.import_module(old), name)
    finally:
        if saved is not None:  # other tests keep the module object they had
            sys.modules[old] = saved
            parent, _, child = old.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, saved)
    assert found is expected, f"{old}.{name} is not {new}.{name}"
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert deprecations, f"importing {name} from {old} gave no DeprecationWarning"


# -- pickled DDPState ---------------------------------------------------------------------------------


# The state's internals that the tests read are in the next three helpers and ``state.loop.bound``:
# if they move inside the state, change these lines, not the pickles.


def _plan_of(state: Any) -> dict[str, Any]:
    """The plan a state holds, as ``Plan.describe()`` gives it."""
    described: dict[str, Any] = state.loop.controller.plan.describe()
    return described


def _bucket_algorithms(state: Any, step: int) -> list[str]:
    """What each of ``step``'s buckets ran, by bucket index (the loop's own record)."""
    return [t.algorithm for t in sorted(state.loop.profiler.buckets(step), key=lambda t: t.bucket)]


def _events(state: Any) -> list[tuple[int, str, str]]:
    return [(e["step"], e["kind"], e["algorithm"]) for e in state.events]


def _recorded_events(saved: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(e["step"], e["kind"], e["algorithm"]) for e in saved["events"]]


@pytest.mark.parametrize("generation", GENERATIONS, ids=_generation_id)
def test_pickled_ddp_state_loads_with_its_plan(generation: Path) -> None:
    """Each rank's state unpickles before ``stragglerkit.init`` (as a checkpoint is loaded), unbound,
    with the plan, step, algorithm and events it was saved with."""
    import stragglerkit

    recorded = _recorded(generation)
    assert sorted(map(int, recorded["ranks"])) == list(range(recorded["world_size"]))
    for rank, saved in recorded["ranks"].items():
        state = pickle.loads((generation / f"ddp_state.rank{rank}.pkl").read_bytes())
        assert isinstance(state, stragglerkit.DDPState)
        assert not state.loop.bound
        assert _plan_of(state) == saved["plan"], rank
        assert (state.step, state.algorithm) == (saved["step"], saved["algorithm"]), rank
        assert _events(state) == _recorded_events(saved), rank
        assert "switch" in [kind for _, kind, _ in _events(state)], "the artifact should hold a switch"


RESUMED_STEPS = 6


def _integer_model(seed: int) -> nn.Module:
    """make_artifacts.py's model (DDP's buckets as in the saved run) with weights in {-1, 0, 1}:
    with small integer inputs every gradient is a small integer multiple of a power of two, so any
    order of summation gives the same bits and the hook can be held to torch's own all_reduce."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 192), nn.ReLU(), nn.Linear(192, 8))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-1, 2, p.shape))
    return model


def _integer_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(-2, 3, (16, 64), generator=g).float(), torch.randint(-1, 2, (16, 8), generator=g).float()


def _flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def resume_body(rank: int, n: int, generation: str, whose: str, late_rank: int, late_s: float) -> dict[str, Any]:
    """One rank: ``stragglerkit.init()``, load the pickled state (``whose``: ``own`` this rank's,
    ``rank0`` rank 0's on every rank, as with one checkpoint file), register it on DDP and run
    :data:`RESUMED_STEPS` steps with the straggler still late; every step's averaged gradients are
    compared with torch's all_reduce of the same local gradients."""
    import stragglerkit

    folder = Path(generation)
    recorded = _recorded(folder)
    stragglerkit.init()
    source = rank if whose == "own" else 0
    with open(folder / f"ddp_state.rank{source}.pkl", "rb") as f:
        state = pickle.load(f)
    restored = {"step": state.step, "algorithm": state.algorithm, "plan": _plan_of(state), "events": _events(state)}
    model = _integer_model(0)
    local = copy.deepcopy(model)  # the same weights, no DDP: this rank's own gradients
    ddp = DDP(model, bucket_cap_mb=recorded["bucket_cap_mb"])
    ddp.register_comm_hook(state, stragglerkit.ddp_hook)
    grads: list[np.ndarray] = []
    mismatches: list[int] = []
    algorithms: list[str] = []
    bucket_algorithms: list[list[str]] = []
    for step in range(RESUMED_STEPS):
        x, weight = _integer_batch(rank, step)
        ddp.zero_grad(set_to_none=True)
        local.zero_grad(set_to_none=True)
        loss = (ddp(x) * weight).sum()
        if rank == late_rank:
            time.sleep(late_s)
        loss.backward()
        (local(x) * weight).sum().backward()
        expected = _flat_grads(local)
        dist.all_reduce(expected)
        expected /= n
        got = _flat_grads(model)
        mismatches.append(int((got != expected).sum()))
        grads.append(got.numpy().copy())
        algorithms.append(state.algorithm)
        bucket_algorithms.append(_bucket_algorithms(state, state.step - 1))
    state.close()
    stragglerkit.destroy()
    return {
        "restored": restored,
        "step": state.step,
        "events": _events(state),
        "grads": grads,
        "mismatches": mismatches,
        "algorithms": algorithms,
        "bucket_algorithms": bucket_algorithms,
    }


@pytest.mark.parametrize("whose", ["own", "rank0"], ids=["each_rank_its_own", "every_rank_rank0s"])
@pytest.mark.parametrize("generation", GENERATIONS, ids=_generation_id)
def test_pickled_ddp_state_resumes_its_plan_in_ddp(generation: Path, whose: str) -> None:
    """Real processes on gloo over loopback, as many as the state was saved on (StragglAR needs an
    even number from 4): the loaded state resumes at its step with its plan from the first step
    (no new warm-up), its buckets run the plan's algorithms, and the averaged gradients equal
    torch's all_reduce bit for bit and are the same bits on every rank."""
    recorded = _recorded(generation)
    n = recorded["world_size"]
    results = run_group(n, resume_body, str(generation), whose, recorded["late_rank"], 0.03)
    saved = recorded["ranks"]["0"]
    for rank in range(n):
        out = results[rank]
        source = recorded["ranks"][str(rank if whose == "own" else 0)]
        assert out["restored"] == {
            "step": source["step"],
            "algorithm": source["algorithm"],
            "plan": source["plan"],
            "events": _recorded_events(source),
        }, rank
        assert out["mismatches"] == [0] * RESUMED_STEPS, (rank, out["mismatches"])
        assert out["algorithms"] == [saved["algorithm"]] * RESUMED_STEPS, (rank, out["algorithms"])
        planned = set(saved["plan"]["buckets"]) | {saved["plan"]["default"]}
        for ran in out["bucket_algorithms"]:
            assert saved["algorithm"] in ran and set(ran) <= planned, (rank, out["bucket_algorithms"])
        assert out["step"] == source["step"] + RESUMED_STEPS
        assert out["events"][: len(source["events"])] == _recorded_events(source), rank
        for step in range(RESUMED_STEPS):
            assert np.array_equal(out["grads"][step], results[0]["grads"][step]), (rank, step)


# -- stragglerkit report on the artifacts -------------------------------------------------------------


def _report(inputs: list[Path], out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """``stragglerkit report INPUTS -o OUT`` through the command line's entry point; (page text, stdout)."""
    from stragglerkit.cli import main

    capsys.readouterr()
    code = main(["report", *map(str, inputs), "-o", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "problem" not in printed.err and "left out" not in printed.err, printed.err
    page = out.read_text(encoding="utf-8")
    page = re.sub(r"<(style|script)\b.*?</\1>", " ", page, flags=re.S)
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))
    return text, printed.out


def _decisions(log: Path) -> list[dict[str, Any]]:
    """The decision records of an event log (neither the ``run`` header nor the ``window`` lines)."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [d for d in lines if d.get("kind") not in ("run", "window")]


@pytest.mark.parametrize("generation", GENERATIONS, ids=_generation_id)
def test_report_reads_the_event_logs(generation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The DDP run's event logs (every rank's): the page names the straggler and the switch the logs
    recorded, at their steps."""
    recorded = _recorded(generation)
    n = recorded["world_size"]
    text, printed = _report([generation / "events"], tmp_path / "report.html", capsys)
    decisions = _decisions(generation / "events" / "events.rank0.jsonl")
    assert f"ranks {', '.join(map(str, range(n)))};" in printed and f"; {len(decisions)} decisions" in printed
    switches = [d for d in decisions if d["kind"] == "switch"]
    detected = [d for d in decisions if d["kind"] == "detected_straggler"]
    assert switches and detected
    for d in detected:
        assert re.search(rf"straggler on rank {recorded['late_rank']} at step {d['step']}\b", text), text[:2000]
    for d in switches:
        assert re.search(rf"switched to {d['algorithm']}\S* at step {d['step']}\b", text), text[:2000]


@pytest.mark.parametrize("generation", GENERATIONS, ids=_generation_id)
def test_report_reads_the_allreduce_bench_json(
    generation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The AllReduce bench's JSON: every iteration of every case a step, the cases in a table."""
    bench = json.loads((generation / "bench_allreduce.json").read_text())
    cases = len(bench["rows"])
    runs = cases * bench["header"]["config"]["iters"]
    ranks = ", ".join(map(str, range(bench["header"]["config"]["world_size"])))
    text, printed = _report([generation / "bench_allreduce.json"], tmp_path / "bench.html", capsys)
    assert f"ranks {ranks}; {runs} steps" in printed, printed
    assert f"AllReduce benchmark: {cases} cases, {runs} measured AllReduces." in text, text[:2000]
    for row in bench["rows"]:
        assert row["algorithm"] in text


@pytest.mark.parametrize("generation", GENERATIONS, ids=_generation_id)
def test_report_reads_the_training_bench_json_and_its_logs(
    generation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training bench's JSON with its hooked copy's event logs, one run: the JSON names its
    ``--event-log`` folder relative to the folder the bench ran in, where the report runs too."""
    monkeypatch.chdir(generation)
    train = json.loads(Path("bench_train/train.json").read_text())
    text, printed = _report([Path("bench_train")], tmp_path / "train.html", capsys)
    assert f"{len(train['events'])} decisions" in printed
    assert "time saved (bench, steady state)" in text, text[:2000]
    if train["switched_step"] is not None:
        assert re.search(rf"switched to {train['algorithm']}\S* at step {train['switched_step']}\b", text)


# -- the commands in the docs -----------------------------------------------------------------------

DOC_FILES = (
    "README.md",
    "docs/*.md",
    "examples/README.md",
    "examples/*/README.md",
    "profiling/README.md",
    "configs/README.md",
)
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
"""Fenced blocks read for commands (``python`` blocks are code, not commands)."""
REPO_DIRS = ("examples", "profiling", "scripts", "tests")
"""A script is checked when its path starts with one of these (``train.py`` is the user's)."""
PYTHONS = ("python", "python3")
PREFIXES = ("sudo", "-E", "env", "time", "nohup", "exec")
"""What may stand before a program (besides ``VAR=value``)."""
LAUNCHERS = ("torchrun", "horovodrun", "mpirun", "srun")
"""Start the program that follows their options: the program's ``--help`` is checked, without them."""
WRAPPERS = ("profiling/nsys_capture.sh",)
"""Scripts that run the command given after them: the command is checked too."""
NO_HELP: dict[str, str] = {
    "tests/report_bodies.py": "takes only the folder to write an example run into; no --help",
    "profiling/nsys_capture.sh": "a wrapper that profiles the command given after it; no options of its own",
}
"""Scripts the docs name that are not argparse programs: only their existence is checked. So is
every ``.sh``: the shell scripts run benchmarks or install things (most as root) and take their
settings from the environment, not from options."""
WORD = re.compile(r"[a-z][a-z0-9_-]*")
"""What a subcommand looks like (``stragglerkit COMMAND`` and ``bench:`` in printed output do not)."""
PLACEHOLDER = re.compile(r"(^|[/:,=])([A-Z][A-Z_]*)($|[/:,=.])|\.\.\.|…")
"""``DIR``, ``FILE``, ``RANK:L``, ``ALG``, ``...``: a line with one is read for its option names only."""


@dataclass(frozen=True, order=True)
class DocCommand:
    """One command as the docs write it."""

    kind: str
    """``cli`` (``stragglerkit SUB ...``), ``module`` (``python -m MODULE ...``) or ``script``
    (``python PATH ...``, ``bash PATH``)."""
    target: str
    """``cli``: the subcommand; ``module``: the module; ``script``: its path from the repository root."""
    args: tuple[str, ...]
    where: str
    """``file:line`` of its first appearance."""
    runnable: bool
    """Shown as a line to run (a code block) and free of placeholders: parsed as written."""

    @property
    def key(self) -> str:
        return " ".join(("stragglerkit" if self.kind == "cli" else "python", self.target, *self.args))

    @property
    def existence_only(self) -> bool:
        return self.kind == "script" and (self.target.endswith(".sh") or self.target in NO_HELP)

    def help_argv(self) -> tuple[str, ...]:
        """What asks for the help of what the docs call (its subcommand's, if it names one)."""
        sub = [self.args[0]] if self.args and WORD.fullmatch(self.args[0]) else []
        if self.kind == "cli":
            return (self.target, "--help")
        if self.kind == "module":
            return ("-m", self.target, *sub, "--help")
        return (self.target,) if self.existence_only else (self.target, *sub, "--help")


def _code_texts(markdown: str) -> list[tuple[int, str, bool]]:
    """(line number, text, from a block) of every line of a shell-like fenced block (continuations
    joined) and of every code span outside the blocks."""
    texts: list[tuple[int, str, bool]] = []
    fence: str | None = None
    shell = False
    pending = ""
    for number, line in enumerate(markdown.splitlines(), 1):
        opener = re.match(r"\s*(```+|~~~+)\s*([\w+-]*)", line)
        if fence is None and opener:
            fence, shell = opener.group(1), opener.group(2).lower() in SHELL_FENCES
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            elif shell:
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                texts.append((number, pending + line, True))
                pending = ""
            continue
        texts.extend((number, span, False) for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", line))
    return texts


def _simple_commands(text: str) -> list[list[str]]:
    """The simple commands of one shell line, split at ``|``, ``&&``, ``;``, without comments,
    prompts and redirections. A line that does not tokenise (prose in a code span) gives none."""
    lexer = shlex.shlex(re.sub(r"^\s*\$\s+", "", text), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    commands: list[list[str]] = [[]]
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in ("|", "||", "&&", ";", "&", "(", ")"):
            commands.append([])
        elif token.startswith((">", "<")):
            skip = True
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _repo_path(token: str) -> str | None:
    """``token`` as a script of the repository (``examples/...py``, ``profiling/...sh``), else None."""
    path = token.removeprefix("./")
    if "/" in path and path.split("/", 1)[0] in REPO_DIRS and path.endswith((".py", ".sh")):
        return path
    return None


def _commands_in(tokens: list[str], where: str, block: bool) -> list[DocCommand]:
    """The commands in one simple command. The program comes first, after ``VAR=value`` settings
    and :data:`PREFIXES`; a launcher (:data:`LAUNCHERS`) or a wrapper (:data:`WRAPPERS`) is passed
    over to the program it starts. A bare script path is a command only in a code block (in a code
    span it names a file)."""
    i = 0
    while i < len(tokens) and (re.fullmatch(r"[A-Za-z_]\w*=.*", tokens[i]) or tokens[i] in PREFIXES):
        i += 1
    if i == len(tokens):
        return []
    head, rest = tokens[i], tokens[i + 1 :]
    if head == "stragglerkit":
        return [_cli(rest, where, block)] if rest and WORD.fullmatch(rest[0]) else []
    if head in PYTHONS:
        return _python_command(rest, where, block)
    if head in ("bash", "sh") and rest:
        head, rest, block = rest[0], rest[1:], True
    path = _repo_path(head)
    if path is not None and block:
        wrapped = _commands_in(rest, where, block) if path in WRAPPERS else []
        return [DocCommand("script", path, tuple(rest), where, False), *wrapped]
    if head in LAUNCHERS:  # its options take values: the program is the first token that is one
        for j, token in enumerate(rest):
            if token in (*PYTHONS, "bash", "sh", "stragglerkit") or _repo_path(token):
                return _commands_in(rest[j:], where, True)
            if token == "-m":
                return _python_command(rest[j:], where, block)
    return []


def _cli(args: list[str], where: str, block: bool) -> DocCommand:
    runnable = block and not any(PLACEHOLDER.search(a) for a in args[1:])
    return DocCommand("cli", args[0], tuple(args[1:]), where, runnable)


def _python_command(rest: list[str], where: str, block: bool) -> list[DocCommand]:
    """``python REST``: a module of this repository run with ``-m``, or one of its scripts."""
    if len(rest) >= 2 and rest[0] == "-m":
        module, args = rest[1], rest[2:]
        if module == "stragglerkit.cli" and args and WORD.fullmatch(args[0]):  # the module itself runs too
            return [_cli(args, where, block), DocCommand("module", module, (), where, False)]
        if module == "torch.distributed.run":
            return _commands_in(["torchrun", *args], where, block)
        if module.split(".")[0] in ("stragglerkit", *REPO_DIRS):
            return [DocCommand("module", module, tuple(args), where, False)]
        return []
    path = _repo_path(rest[0]) if rest else None
    return [DocCommand("script", path, tuple(rest[1:]), where, False)] if path is not None else []


def documented_commands() -> list[DocCommand]:
    """Every distinct command in the docs, where it first appears (runnable if it is anywhere)."""
    seen: dict[tuple[str, str, tuple[str, ...]], DocCommand] = {}
    for pattern in DOC_FILES:
        for path in sorted(REPO.glob(pattern)):
            for number, text, block in _code_texts(path.read_text(encoding="utf-8")):
                for tokens in _simple_commands(text):
                    for command in _commands_in(tokens, f"{path.relative_to(REPO)}:{number}", block):
                        key = (command.kind, command.target, command.args)
                        known = seen.get(key)
                        if known is None or (command.runnable and not known.runnable):
                            seen[key] = command
    return sorted(seen.values())


DOC_COMMANDS = documented_commands()
CLI_COMMANDS = [c for c in DOC_COMMANDS if c.kind == "cli"]
HELP_TARGETS = sorted({c.help_argv() for c in DOC_COMMANDS})
"""What to ask for help: each subcommand, module (with its subcommand) and script once."""


def _help(argv: tuple[str, ...]) -> tuple[int, str]:
    """Exit status of ``--help`` for ``argv`` (a script's existence for ``(path,)``), and the output
    on failure. The ``stragglerkit`` command runs in this process (its entry point, ``main``)."""
    if "--help" not in argv:
        exists = (REPO / argv[0]).is_file()
        return (0, "") if exists else (1, f"{argv[0]} does not exist")
    if not argv[0].startswith("-") and not argv[0].endswith(".py"):  # a stragglerkit subcommand
        from stragglerkit.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
        return code, err.getvalue()[-2000:]
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, (done.stdout + done.stderr)[-2000:]


@pytest.fixture(scope="module")
def help_results() -> dict[tuple[str, ...], tuple[int, str]]:
    """Every target's ``--help``, the subprocesses side by side, one per core (each imports torch: ~2 s)."""
    subprocesses = [argv for argv in HELP_TARGETS if argv[0] == "-m" or argv[0].endswith(".py")]
    results = {argv: _help(argv) for argv in HELP_TARGETS if argv not in subprocesses}
    with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        results.update(zip(subprocesses, pool.map(_help, subprocesses)))
    return results


def test_the_docs_show_commands() -> None:
    """The extraction finds the README's commands (were the docs' format to change so that it
    found none, every test below would pass without checking anything)."""
    found = {(c.kind, c.target) for c in DOC_COMMANDS}
    assert {("cli", "report"), ("cli", "bench"), ("cli", "schedule"), ("cli", "simulate")} <= found, sorted(found)
    assert any(kind == "script" and target.startswith("examples/") for kind, target in found), sorted(found)
    assert any(c.runnable for c in CLI_COMMANDS)


def _help_id(argv: tuple[str, ...]) -> str:
    if "--help" not in argv:
        return f"exists {argv[0]}"
    program = "python" if argv[0] == "-m" or argv[0].endswith(".py") else "stragglerkit"
    return " ".join((program, *argv))


@pytest.mark.parametrize("argv", HELP_TARGETS, ids=[_help_id(argv) for argv in HELP_TARGETS])
def test_documented_command_answers_help(
    argv: tuple[str, ...], help_results: dict[tuple[str, ...], tuple[int, str]]
) -> None:
    """``stragglerkit SUB --help``, ``python -m MODULE [SUB] --help``, ``python SCRIPT [SUB] --help``
    exit 0; a script in :data:`NO_HELP` or a shell script exists."""
    where = sorted({c.where for c in DOC_COMMANDS if c.help_argv() == argv})
    code, output = help_results[argv]
    assert code == 0, f"{' '.join(argv)} (shown at {', '.join(where)}) exited {code}:\n{output}"


def _subparser(sub: str) -> argparse.ArgumentParser:
    from stragglerkit.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices[sub]
    return parser


@pytest.mark.parametrize("command", CLI_COMMANDS, ids=[c.key for c in CLI_COMMANDS])
def test_documented_stragglerkit_command_parses(command: DocCommand) -> None:
    """A line to run (a code block without placeholders) parses as written through the command
    line's parser (nothing is run); any other mention (a code span, ``--json FILE``) names only
    options that exist."""
    from stragglerkit.cli import build_parser

    if command.runnable:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                build_parser().parse_args([command.target, *command.args])
            except SystemExit as exit_:
                message = err.getvalue()[-2000:]
                pytest.fail(f"{command.key} (shown at {command.where}) does not parse (exit {exit_.code}):\n{message}")
    else:
        known = _subparser(command.target)._option_string_actions
        unknown = [a for a in command.args if a.startswith("-") and a.split("=")[0] not in known]
        assert not unknown, f"{command.key} (shown at {command.where}): no option {', '.join(unknown)}"
