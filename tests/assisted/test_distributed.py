"""`assisted.jobs.distributed.BatchGenerator` in-process, and `structspec batch --ray`'s driver on a local Ray
instance with 2 CPUs: tiny random models (injected through the loader hook) and SmolLM2's real tokenizer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from assisted.jobs.run import BatchError, read_input
from assisted.jobs.distributed import BatchGenerator, output_record, rows_of
from tests.assisted.test_cli import POINT, V
from tests.helpers_models import smollm2_tokenizer, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]

OPTIONS = {"max_new_tokens": 24}


def tiny_loader(model, assistant, **load_options):
    """The loader hook: a tiny random target and assistant, SmolLM2's tokenizer (whatever the sources say)."""
    return tiny_llama(V, seed=0), smollm2_tokenizer(), tiny_llama(V, seed=1) if assistant else None


def missing_loader(model, assistant, **load_options):
    raise OSError(f"cannot load {model!r} as a local folder or cached hub id (not found)")


class DyingOnce(BatchGenerator):
    """Kills its own process on the document whose prompt mentions `victim`, the first time only (a marker file,
    created exclusively, says it happened)."""

    def __init__(self, *args, marker: str, victim: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.marker, self.victim = marker, victim

    def generate_one(self, document):
        if self.victim in (document.prompt or ""):
            try:
                open(self.marker, "x").close()
            except FileExistsError:
                pass  # the retry: generate as usual
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().generate_one(document)


def generator(**extra):
    return BatchGenerator("tiny", "tiny2", schema=POINT, options=OPTIONS, threads=1, loader=tiny_loader, **extra)


def test_a_batch_of_rows_becomes_batch_output_lines():
    pandas = pytest.importorskip("pandas")
    column = lambda *values: pandas.Series(values, dtype=object)  # noqa: E731
    batch = pandas.DataFrame({"id": column("a", 7, "c"), "line": column(1, 2, 3),
                              "prompt": column("Point number 1:", None, 5),  # 5: an error row, and the batch goes on
                              "messages": column(None, [{"role": "user", "content": "Point number 2:"}], None)})
    rows = [output_record(row) for row in generator()(batch).to_dict(orient="records")]
    assert [r["id"] for r in rows] == ["a", 7, "c"]
    for row in rows[:2]:
        assert set(row) == {"id", "text", "value", "stop_reason", "stats"}
        jsonschema.validate(row["value"], POINT)
        assert json.loads(row["text"]) == row["value"]
    assert rows[2] == {"id": "c", "line": 3, "error": '"prompt" must be a string, got int'}


def test_a_worker_drafts_with_an_assistant_of_another_tokenizer(sentencepiece_tokenizer):
    """A loader that gives the assistant's own tokenizer: the worker drafts across vocabularies, and its greedy output
    is plain decoding of the target (before, `generate` was called without it and every row was an error)."""
    from assisted import generate
    tok, target = smollm2_tokenizer(), tiny_llama(V, seed=0)
    helper = tiny_llama(len(sentencepiece_tokenizer), seed=5)
    worker = BatchGenerator("tiny", "other", schema=POINT, options=OPTIONS, threads=1,
                            loader=lambda model, assistant, **_: (target, tok, helper, sentencepiece_tokenizer))
    [row] = [output_record(r) for r in worker({"id": ["a"], "prompt": ["Point number 1:"]}).to_dict(orient="records")]
    plain = generate(target, tokenizer=tok, prompt="Point number 1:", schema=POINT, **OPTIONS)
    assert "error" not in row, row
    assert (row["text"], row["stop_reason"]) == (plain.text, plain.stop_reason)
    assert row["stats"]["assistant_forward_passes"] > 0


def test_numpy_and_arrow_batches_read_as_the_same_rows():
    numpy, pyarrow = pytest.importorskip("numpy"), pytest.importorskip("pyarrow")
    messages = [[{"role": "user", "content": "hi", "name": None}], None]
    table = pyarrow.Table.from_pylist([{"id": 1, "prompt": None, "messages": messages[0]},
                                       {"id": 2, "prompt": "p", "messages": None}])
    arrays = {"id": numpy.array([1, 2]), "prompt": numpy.array([None, "p"], dtype=object),
              "messages": numpy.array([numpy.array(messages[0], dtype=object), None], dtype=object)}
    expected = [{"id": 1, "messages": [{"role": "user", "content": "hi"}]}, {"id": 2, "prompt": "p"}]
    assert rows_of(table) == expected and rows_of(arrays) == expected


def test_a_loader_failure_is_one_line_naming_the_model():
    from assisted.jobs.distributed import LoadError
    with pytest.raises(LoadError) as raised:
        BatchGenerator("nowhere", loader=missing_loader)
    assert str(raised.value) == ("cannot load --model nowhere: cannot load 'nowhere' as a local folder or cached "
                                 "hub id (not found)")


def test_the_library_imports_without_ray():
    code = ("import sys; sys.modules['ray'] = None\n"
            "import assisted, assisted.jobs.distributed, assisted.jobs.ray, assisted.cli\n"
            "assisted.cli.parse_args(['batch', '--model', 'm', '--input', 'i', '--output', 'o', '--ray'])")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_ray_settings_follow_the_batch_arguments(tmp_path, capsys):
    from assisted.cli import main, parse_args
    from assisted.jobs.ray import ray_settings
    args = parse_args(["batch", "--model", "m", "--assistant", "a", "--input", "i", "--output", "o", "--ray",
                       "ray://head:10001", "--workers", "3", "--device", "cuda:1", "--dtype", "bfloat16"])
    settings = ray_settings(args, {"regex": "a+"}, {"max_new_tokens": 9})
    assert (settings.address, settings.workers, settings.gpus_per_worker) == ("ray://head:10001", 3, 1)
    assert settings.worker_kwargs["device"] == "cuda" and settings.worker_kwargs["regex"] == "a+"
    assert settings.worker_kwargs["load_options"]["dtype"] == "bfloat16"
    local = parse_args(["batch", "--model", "m", "--input", "i", "--output", "o", "--ray"])
    assert ray_settings(local, {}, {}).address is None
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": 1, "prompt": "p"}\n')
    assert main(["batch", "--model", "m", "--input", str(docs), "--output", str(tmp_path / "out.jsonl"), "--ray",
                 "--workers", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "structspec: error: --workers and --threads-per-worker must be >= 1, got 0 and 1"


# --- on a local Ray instance ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    from assisted.jobs.ray import start_local_ray
    start_local_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture
def documents(tmp_path):
    lines = [json.dumps({"id": f"d{i}", "prompt": f"Point number {i}:"}) for i in range(6)]
    lines.insert(3, "{not json")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(lines) + "\n")
    return read_input(docs)


@pytest.mark.ray
def test_ray_batch_resumes_and_writes_each_id_once_after_a_killed_worker(local_ray, documents, tmp_path):
    from assisted.jobs.ray import RaySettings, run_ray_batch
    docs = list(documents.documents())
    out, marker = tmp_path / "out.jsonl", tmp_path / "killed"
    here = generator()  # the same models in this process: the reference outputs
    reference = {d.id: output_record(row) for d, row in
                 zip(docs, here({"id": [d.id for d in docs], "prompt": [d.prompt for d in docs]})
                     .to_dict(orient="records"))}
    first = json.dumps(reference["d0"]) + "\n"
    out.write_text(first)  # an earlier run did d0
    kwargs = {"model": "tiny", "assistant": "tiny2", "schema": POINT, "options": OPTIONS, "loader": tiny_loader,
              "marker": str(marker), "victim": "number 4"}
    settings = RaySettings(workers=2, threads_per_worker=1, worker_kwargs=kwargs, worker_class=DyingOnce)
    summary = run_ray_batch(documents, out, settings, report=lambda message: None, progress=False)

    assert marker.exists()  # the worker holding d4 died once
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert out.read_text().startswith(first)
    assert sorted(str(r["id"]) for r in rows) == sorted(["d0", "d1", "d2", "d3", "d4", "d5", "None"])
    assert [r for r in rows if "error" in r] == [{"id": None, "line": 4, "error": rows[1]["error"]}]
    for row in (r for r in rows if "error" not in r):
        jsonschema.validate(row["value"], POINT)
        assert {k: row[k] for k in ("text", "value", "stop_reason")} == \
               {k: reference[row["id"]][k] for k in ("text", "value", "stop_reason")}  # greedy: the same outputs
    assert (summary.written, summary.skipped, summary.bad, summary.failed) == (5, 1, 1, 0)

    again = run_ray_batch(documents, out, settings, report=lambda message: None, progress=False)
    assert (again.written, again.skipped) == (0, 6) and len(out.read_text().splitlines()) == len(rows)


DRIVER_CHILD = """
import sys
import assisted.jobs.ray as ray_batch
from assisted.jobs.run import read_input
from tests.assisted.test_distributed import OPTIONS, POINT, tiny_loader

real, writes = ray_batch.write_line, []

def write(out, record):
    writes.append(1)
    if len(writes) == int(sys.argv[3]):
        print("writing", flush=True)  # the lines before this one are written and flushed
        sys.stdin.readline()  # wait here for the parent's SIGKILL
    real(out, record)

ray_batch.write_line = write
kwargs = {"model": "tiny", "assistant": "tiny2", "schema": POINT, "options": OPTIONS, "loader": tiny_loader}
settings = ray_batch.RaySettings(workers=1, threads_per_worker=1, worker_kwargs=kwargs)
ray_batch.run_ray_batch(read_input(sys.argv[1]), sys.argv[2], settings, report=lambda message: None, progress=False)
"""


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Ray's node processes under a driver that started them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@pytest.mark.ray
def test_a_ray_driver_killed_mid_run_then_rerun_writes_each_id_once(documents, tmp_path):
    """SIGKILL of `--ray`'s driver after three documents, then a rerun (its own local Ray, or the module's): each id
    once, the killed run's lines first."""
    pytest.importorskip("ray")
    from assisted.jobs.ray import RaySettings, run_ray_batch
    docs, out, script = tmp_path / "docs.jsonl", tmp_path / "out.jsonl", tmp_path / "driver.py"
    script.write_text(DRIVER_CHILD)
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, str(script), str(docs), str(out), "4"], cwd=root,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    below = []
    try:
        assert child.stdout.readline() == "writing\n"
        below = descendants(child.pid)  # its local Ray instance: ended below, by pid, as the driver's SIGKILL would not
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert child.returncode == -signal.SIGKILL
    killed = out.read_bytes()
    assert killed.count(b"\n") == 4  # the bad line (not a document: not counted by the hook) and three documents
    kwargs = {"model": "tiny", "assistant": "tiny2", "schema": POINT, "options": OPTIONS, "loader": tiny_loader}
    settings = RaySettings(workers=1, threads_per_worker=1, worker_kwargs=kwargs)
    summary = run_ray_batch(documents, out, settings, report=lambda message: None, progress=False)
    assert out.read_bytes().startswith(killed)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(str(r["id"]) for r in rows) == sorted(["d0", "d1", "d2", "d3", "d4", "d5", "None"])  # each once
    assert (summary.written, summary.skipped, summary.bad) == (3, 3, 1)


@pytest.mark.ray
def test_a_worker_that_cannot_load_fails_the_run_with_one_line(local_ray, documents, tmp_path):
    from assisted.jobs.ray import RaySettings, run_ray_batch
    settings = RaySettings(workers=1, worker_kwargs={"model": "nowhere", "loader": missing_loader})
    with pytest.raises(BatchError) as raised:
        run_ray_batch(documents, tmp_path / "out.jsonl", settings, report=lambda message: None, progress=False)
    assert str(raised.value) == ("cannot load --model nowhere: cannot load 'nowhere' as a local folder or cached "
                                 "hub id (not found)")


def test_a_local_run_checks_the_sources_before_starting_ray(documents, tmp_path):
    from assisted.jobs.ray import RaySettings, run_ray_batch
    settings = RaySettings(worker_kwargs={"model": str(tmp_path / "nowhere")})
    with pytest.raises(BatchError, match=r"^cannot load --model .*nowhere: cannot load '.*nowhere' as a local folder"):
        run_ray_batch(documents, tmp_path / "out.jsonl", settings, report=lambda message: None, progress=False)
    assert not (tmp_path / "out.jsonl").exists()
