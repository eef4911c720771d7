"""The deployment's processes beside the web servers (harness.LiveServer): nginx in front on
deploy/nginx.conf, a subprocess the test owns and stops. The Celery worker's is
harness.celery_worker (benches start workers too)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness import free_port
from harness.live_server import REPO_DIR

NGINX = shutil.which("nginx")
NGINX_READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
# Where nginx, built for a root install, would otherwise write (/var/lib/nginx/..., /var/log).
NGINX_TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def site_configuration(upstream_ports: list[int], listen_port: int) -> str:
    """deploy/nginx.conf as shipped, with the test's ports in place of 80 and 8001, 8002."""
    text = (REPO_DIR / "deploy" / "nginx.conf").read_text()
    servers = re.findall(r"^\s*server 127\.0\.0\.1:\d+ .*;$", text, flags=re.MULTILINE)
    if len(servers) != len(upstream_ports) or "listen 80;" not in text:
        raise ValueError(f"deploy/nginx.conf no longer has {len(upstream_ports)} upstream servers")
    for line, port in zip(servers, upstream_ports, strict=True):
        text = text.replace(line, re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", line))
    return text.replace("listen 80;", f"listen 127.0.0.1:{listen_port};")


class Nginx:
    """nginx in the foreground (`daemon off`) on deploy/nginx.conf, everything it writes under
    `directory` (`-p` prefix, temp paths, logs, pid), listening on 127.0.0.1:`port`."""

    def __init__(self, directory: Path, upstream_ports: list[int]) -> None:
        self.directory = directory
        self.port = free_port()
        self.error_log = directory / "error.log"
        self.access_log = directory / "access.log"
        (directory / "conf.d").mkdir(parents=True)
        site = directory / "conf.d" / "cachet.conf"
        site.write_text(site_configuration(upstream_ports, self.port))
        temp = "".join(f"  {name}_temp_path {directory / name};\n" for name in NGINX_TEMP_PATHS)
        # NOTE: as root, nginx's workers would switch to `nobody`, who may not enter the test's
        # temporary directory (0700) to buffer a request body; they stay this user instead.
        user = "user root;\n" if os.geteuid() == 0 else ""
        self.config = directory / "nginx.conf"
        self.config.write_text(
            f"{user}daemon off;\nworker_processes 1;\npid {directory / 'nginx.pid'};\n"
            f"error_log {self.error_log} info;\nevents {{ worker_connections 256; }}\n"
            f"http {{\n  access_log {self.access_log};\n{temp}  include {site};\n}}\n"
        )
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [NGINX or "nginx", "-p", str(self.directory), "-c", str(self.config)]
        check = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t failed: {check.stderr}")
        with (self.directory / "nginx.out").open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + NGINX_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.error_log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=5):
                    return
            except urllib.error.HTTPError:
                return  # an answer from a web process through nginx (503 while a model loads)
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer in {NGINX_READY_TIMEOUT_S:.0f}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: open connections finish
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
