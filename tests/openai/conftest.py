"""Start `cachefit serve` on a free loopback port for the OpenAI-client tests.

CACHEFIT_BIN: the binary (default target/release/cachefit);
CACHEFIT_MODELS: the folder holding SmolLM2-135M-Instruct.Q4_1.gguf
(default ~/.cache/cachefit/models).
"""

import os
import pathlib
import queue
import signal
import subprocess
import threading
import time

import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
API_KEY = "test-key"
# Per-slot context, slots and body limit of the test server.
N_CTX = 512
SLOTS = 8
MAX_BODY = 65536


def model_path(name: str = "SmolLM2-135M-Instruct.Q4_1.gguf") -> pathlib.Path:
    models = os.environ.get("CACHEFIT_MODELS") or os.path.expanduser("~/.cache/cachefit/models")
    path = pathlib.Path(models) / name
    if not path.is_file():
        pytest.fail(f"test model {path} not found; run scripts/fetch-models.sh")
    return path


class Server:
    def __init__(self, args, model=None):
        binary = os.environ.get("CACHEFIT_BIN") or str(ROOT / "target" / "release" / "cachefit")
        if not os.path.isfile(binary):
            pytest.fail(f"{binary} not found: build it with cargo build --release -p cachefit")
        self.proc = subprocess.Popen(
            [binary, "serve", "-m", str(model or model_path()), "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        lines = queue.Queue()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 60
        self.base = None
        while self.base is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail("the server did not start:\n" + "".join(self.log))
            if "listening on http://" in line:
                self.base = "http://" + line.split("listening on http://", 1)[1].strip()

    def client(self, **kw) -> openai.OpenAI:
        kw.setdefault("api_key", API_KEY)
        return openai.OpenAI(base_url=self.base + "/v1", max_retries=0, timeout=120, **kw)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return code


@pytest.fixture(scope="session")
def server():
    s = Server(
        [
            "-c", str(N_CTX),
            "--parallel", str(SLOTS),
            "--api-key", API_KEY,
            "--max-body", str(MAX_BODY),
            "-t", "2",
        ]
    )
    yield s
    code = s.stop()
    assert code == 0, "".join(s.log)


@pytest.fixture
def client(server):
    return server.client()
