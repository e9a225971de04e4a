"""The lab procedure's commands, written once.

docs/how-to/lab-bring-up.md shows these commands (each prefixed with ``sudo`` where it needs
root) and the rehearsal runs them; `tests/house/test_lab_procedure.py` checks that the page
holds every one of them verbatim, so the page and the rig cannot drift apart again (issue
34: two procedures on one page that disagreed, and steps that did not run as written).
"""

from __future__ import annotations

import shlex

SERVICE_USER = "oddl"
VENV = "/opt/oddl/.venv"
ODDL = f"{VENV}/bin/oddl"
SYSTEM_PYTHON = "/usr/bin/python3"
"""The lab's python3: the service user must be able to run the venv's interpreter, which a
python under /root (pyenv) is not."""
ETC = "/etc/oddl"
TESTBED = f"{ETC}/testbed.toml"
CERTS = f"{ETC}/certs"
DDP_PORT = 29500
RDZV_PORT = 29400
"""torchrun's c10d rendezvous (the elastic form) on the first host."""

SERVICE_USER_ADD = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
                    "/var/lib/oddl", "--shell", "/usr/sbin/nologin", SERVICE_USER]
BUILD_WHEEL = ["python3", "-m", "pip", "wheel", "--no-deps", "-w", "dist", "."]
MAKE_VENV = [SYSTEM_PYTHON, "-m", "venv", VENV]
INSTALL = [f"{VENV}/bin/pip", "install"]
"""Followed by the wheel with its extra: ``'dist/oddl-*.whl[torch]'`` (torch on every host:
the controller host's operator tools import nothing of it, but one install is one step)."""
MAKE_ETC = ["install", "-d", "-m", "0755", ETC]
TEMPLATE = [ODDL, "config", "example", "lab-4node"]
CERTS_INIT_FLAGS = ["--owner", SERVICE_USER]
CERTS_CHOWN = [ODDL, "certs", "chown", "--certs", CERTS, "--owner", SERVICE_USER]


def torchrun(nodes: int, rank: int, master: str, script: str = "train.py",
             port: int = DDP_PORT) -> list[str]:
    """How every training host starts its rank: static rendezvous on the first host."""
    return [f"{VENV}/bin/torchrun", "--nnodes", str(nodes), "--nproc-per-node", "1",
            "--node-rank", str(rank), "--master-addr", master, "--master-port", str(port),
            script]


def torchrun_elastic(nodes: int, endpoint: str, run_id: str, local_addr: str, *,
                     holds_store: bool, script: str = "train.py", restarts: int = 1
                     ) -> list[str]:
    """The elastic form: a c10d rendezvous on the first host (ranks given in order of
    arrival), the group restarted up to `restarts` times when a rank fails. torchrun finds
    both of the addresses it needs from the host's name unless told: the first host says it
    holds the rendezvous store (`is_host=1`, the others 0), and every host gives its own
    address (`--local-addr`), which rank 0 publishes for the others' process-group store.
    Where the name resolves to a loopback address (Debian's 127.0.1.1) or to nothing, the
    guesses leave every host waiting for a store nobody runs, or calling its own loopback."""
    return [f"{VENV}/bin/torchrun", "--nnodes", str(nodes), "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:{RDZV_PORT}",
            "--rdzv-id", run_id, "--rdzv-conf", f"is_host={int(holds_store)}",
            "--local-addr", local_addr, "--max-restarts", str(restarts), script]


def shown(argv: list[str]) -> str:
    """The command as the page shows it (shell quoting)."""
    return shlex.join(argv)


def page_commands() -> list[str]:
    """Every command the page must show verbatim, as `shown` writes it."""
    return [shown(SERVICE_USER_ADD), shown(BUILD_WHEEL), shown(MAKE_VENV), shown(INSTALL),
            shown(MAKE_ETC), shown(TEMPLATE) + f" > {TESTBED}", shown(CERTS_CHOWN),
            shown([ODDL, "certs", "init", "--out", CERTS, "--nodes", "n0,n1,n2,n3", "--hosts",
                   "CONTROLLER_ADDRESS", *CERTS_INIT_FLAGS]),
            shown(torchrun(4, 0, "N0_ADDRESS")).replace("--node-rank 0", "--node-rank R"),
            elastic_shown()]


def elastic_shown() -> str:
    """The elastic form as the pages show it: H is 1 on n0, 0 on the others."""
    return shown(torchrun_elastic(4, "N0_ADDRESS", "RUN_ID", "HOST_ADDRESS",
                                  holds_store=True)).replace("is_host=1", "is_host=H")
