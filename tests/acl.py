"""The Redis ACL users of deploy/redis-acl.conf, applied to servers a test started (the pod user
runs the rules and nothing else; the admin user also loads the library and applies the policy)."""
from __future__ import annotations

import shlex
from pathlib import Path

import redis

ACL_FILE = Path(__file__).resolve().parents[1] / "deploy" / "redis-acl.conf"
POD_PW, ADMIN_PW = "pod-secret-1", "admin-secret-2"
POD_USER, ADMIN_USER = "admission", "admission-admin"


def acl_lines(mesh_pattern: str | None = None) -> list[list[str]]:
    """The file's ACL SETUSER lines as argument lists, passwords filled in (what envsubst does);
    ``mesh_pattern`` narrows adm:* to one mesh (docs/production.md)."""
    out = []
    for line in ACL_FILE.read_text().splitlines():
        if not line.startswith("ACL "):
            continue
        line = line.replace("${ADMISSION_POD_PASSWORD}", POD_PW).replace("${ADMISSION_ADMIN_PASSWORD}", ADMIN_PW)
        if mesh_pattern:
            line = line.replace("~adm:*", f"~{mesh_pattern}").replace("&adm:*", f"&{mesh_pattern}")
        out.append(shlex.split(line))
    return out


def apply_acl(client, lines: list[list[str]]) -> None:
    """Apply the lines like redis-cli does: one by one, an error does not stop the rest. Only an
    add-on line may be refused, and only for a subcommand the server does not have (Redis 7.0:
    CLIENT SETINFO)."""
    for args in lines:
        try:
            client.execute_command(*args)
        except redis.ResponseError as exc:
            assert "reset" not in args and "Unknown command" in str(exc), (args, exc)


def drop_users(client) -> None:
    client.execute_command("ACL", "DELUSER", "admission", "admission-admin")


def user_url(server_url: str, user: str, password: str) -> str:
    return server_url.replace("redis://", f"redis://{user}:{password}@", 1)
