"""A local nginx on 127.0.0.1 serving a folder, with range requests (its static-file default).

For `texstream bench stream --url` and the remote-pack tests: `start()` runs it in the foreground
as one process (no daemon, no master), `stop()` kills it (a server that goes away mid-stream) and
`start()` brings it back on the same port. nginx itself comes from the system (Debian: nginx-light).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["LocalNginx", "find_nginx"]


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.path.exists(p)), None
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalNginx:
    """One nginx process (master_process off: a single process, killed at once)."""

    def __init__(self, binary: str, root: Path, workdir: Path) -> None:
        self.binary, self.root, self.workdir = binary, root, workdir
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "nginx.conf"
        temps = "\n".join(
            f"    {name}_temp_path {workdir / name};" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        self.conf.write_text(f"""
daemon off;
master_process off;
worker_processes 1;
pid {workdir / "nginx.pid"};
error_log {workdir / "error.log"} warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
{temps}
    sendfile on;
    keepalive_requests 100000;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{self.port};
        root {root};
        location / {{ }}
    }}
}}
""")

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def start(self, timeout: float = 10.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "nginx is running"
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.conf), "-p", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"nginx exited at start: {err.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nginx did not listen on port {self.port} within {timeout} s")

    def stop(self) -> None:
        """Kill it (SIGKILL: connections drop mid-response, as when a server dies)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
