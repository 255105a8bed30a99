"""Escape probes: host files, secrets and writes. The sandbox's root is a private tmpfs holding
read-only binds of the system folders and the interpreter; everything else of the host is absent,
and only the workspace is writable. The host checks that nothing it holds was read or written."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from textwrap import dedent

from escape_probes import HostSecret, ProbeRunner, host_path, probe_output

from tidal.sandbox import SandboxBackend

CHECKOUT = Path(__file__).resolve().parents[2]

SEARCH_CODE = """
def search(value):
    \"\"\"Regular files visible in the sandbox whose content holds `value`. /usr and the
    interpreter are skipped: the host's own read-only files, readable by design (docs/security.md).\"\"\"
    import stat
    found = []
    for folder, dirs, names in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in ("/proc", "/sys", "/usr", "/opt/tidal/python")]
        for name in names:
            path = os.path.join(folder, name)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    with open(path, "rb") as file:
                        if value.encode() in file.read(1 << 20):
                            found.append(path)
            except OSError:
                pass
    return found
"""


def test_etc_shadow_and_passwd_are_absent(probe: ProbeRunner) -> None:
    result = probe.run("""
        report(shadow=attempt(open, "/etc/shadow"), passwd=attempt(open, "/etc/passwd"),
               gshadow=attempt(open, "/etc/gshadow"), etc=sorted(os.listdir("/etc")) if os.access("/etc", os.R_OK) else None)
    """)
    out = probe_output(result)
    # /etc holds only ld.so.cache, in a folder the sandbox user cannot even list.
    assert all(out[name] in ("ENOENT", "EACCES") for name in ("shadow", "passwd", "gshadow")), out
    assert out["etc"] in (None, ["ld.so.cache"]), out


def test_root_and_home_are_absent(probe: ProbeRunner) -> None:
    home = os.path.expanduser("~")
    result = probe.run(f"""
        report(root=attempt(os.listdir, "/root"), home=attempt(os.listdir, "/home"),
               host_home=attempt(os.listdir, {home!r}), ssh=attempt(open, {home + "/.ssh/id_rsa"!r}))
    """)
    assert probe_output(result) == {"root": "ENOENT", "home": "ENOENT", "host_home": "ENOENT", "ssh": "ENOENT"}


def test_project_checkout_is_absent(probe: ProbeRunner) -> None:
    result = probe.run(f"""
        import importlib.util
        report(checkout=attempt(os.listdir, {str(CHECKOUT)!r}),
               pyproject=attempt(open, {str(CHECKOUT / "pyproject.toml")!r}),
               git=attempt(os.listdir, {str(CHECKOUT / ".git")!r}),
               tidal=importlib.util.find_spec("tidal") is not None)
    """)
    assert probe_output(result) == {"checkout": "ENOENT", "pyproject": "ENOENT", "git": "ENOENT", "tidal": False}


def test_secret_file_in_host_tmp_is_absent(probe: ProbeRunner, host_secret: HostSecret) -> None:
    result = probe.run(SEARCH_CODE + dedent(f"""
        report(read=attempt(open, {str(host_secret.path)!r}), tmp=os.listdir("/tmp"),
               found=search({host_secret.value[::-1]!r}[::-1]))  # reversed: the probe file must not match
    """))
    out = probe_output(result)
    assert out["read"] == "ENOENT" and out["found"] == [], out
    assert host_secret.path.name not in out["tmp"] and host_secret.path.parent.name not in out["tmp"]
    assert host_secret.value not in result.stdout_text + result.stderr_text


def test_virtual_environment_is_absent(probe: ProbeRunner, backend: SandboxBackend) -> None:
    # The interpreter and its packages are read-only binds (an environment image); the venv that
    # runs tidal, with tidal itself and the training stack, is not there.
    venv = sys.prefix
    result = probe.run(f"""
        import importlib.util
        report(venv=attempt(os.listdir, {venv!r}), site=sorted(os.listdir("/opt/tidal/site")),
               path=[p for p in sys.path if {venv!r} in p or ".venv" in p],
               origins={{m: getattr(importlib.util.find_spec(m), "origin", None) for m in ("tidal", "torch", "pydantic", "typer")}})
    """)
    out = probe_output(result)
    assert out["venv"] == "ENOENT" and out["path"] == [], out
    assert out["origins"]["tidal"] is None, out
    # Whatever else is importable comes from the bound interpreter, never from the venv.
    assert all(origin is None or origin.startswith("/opt/tidal/python/") for origin in out["origins"].values()), out
    site = host_path(backend, "/opt/tidal/site")
    bound = sorted(inside.rsplit("/", 1)[1] for _, inside in backend.mounts.binds if inside.startswith("/opt/tidal/site/"))  # type: ignore[attr-defined]
    assert out["site"] == (sorted(os.listdir(site)) if site else bound), out["site"]
    assert not any(name.startswith("tidal") or name.endswith(".pth") for name in out["site"]), out["site"]


def test_environment_secrets_are_not_inherited(probe: ProbeRunner, env_secret: str) -> None:
    result = probe.run("""
        def read(path):
            try:
                return open(path, "rb").read().decode(errors="replace")
            except OSError as error:
                return errname(error.errno)
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        report(env=dict(os.environ), self_environ=read("/proc/self/environ"),
               environs={p: read(f"/proc/{p}/environ") for p in pids},
               cmdlines={p: read(f"/proc/{p}/cmdline") for p in pids})
    """)
    out = probe_output(result)
    assert "TIDAL_TEST_SECRET" not in out["env"]
    image_env = set(dict(getattr(getattr(probe.backend, "mounts", None), "env", ())))  # an image's own variables
    assert env_secret not in result.stdout_text and env_secret not in result.stderr_text
    assert os.environ["TIDAL_TEST_SECRET"] == env_secret  # the harness still has it: the probe could have
    # Nothing outside the scrubbed set (docs/design/sandbox.md) comes in.
    allowed = {"PATH", "HOME", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "LANG", "TZ",
               "PYTHONPATH", "LD_LIBRARY_PATH", "TIDAL_HARNESS", "TIDAL_REPORT_FD", "TIDAL_PROBE_MARKER"}
    assert set(out["env"]) - {"PWD", "OLDPWD", "SHLVL", "_"} <= allowed | image_env, sorted(out["env"])


def test_writes_into_the_image_fail_and_leave_nothing_on_the_host(probe: ProbeRunner, backend: SandboxBackend) -> None:
    name = f"tidal-probe-{probe.marker}"
    new_files = [f"/usr/{name}", f"/usr/bin/{name}", f"/opt/tidal/python/{name}", f"/opt/tidal/python/bin/{name}",
                 f"/opt/tidal/site/pytest/{name}", f"/opt/tidal/site/_pytest/{name}"]
    existing = "/opt/tidal/site/pytest/__init__.py"
    on_host = {inside: host_path(backend, inside) or inside for inside in [*new_files, existing]}
    before = Path(on_host[existing]).read_bytes()
    result = probe.run(f"""
        import shutil
        outcomes = {{path: attempt(lambda: open(path, "ab").write(b"pwned")) for path in {[*new_files, existing]!r}}}
        outcomes["rename"] = attempt(os.rename, {existing!r}, "/opt/tidal/site/pytest/moved.py")
        outcomes["rmtree"] = attempt(shutil.rmtree, "/opt/tidal/site/pluggy")
        outcomes["chmod"] = attempt(os.chmod, "/opt/tidal/python/bin", 0o777)
        report(**outcomes)
    """)
    out = probe_output(result)
    assert all(out[path] == "EROFS" for path in new_files), out
    assert out[existing] in ("EROFS", "EACCES"), out  # root's file, on a read-only mount
    assert out["rename"] in ("EROFS", "EACCES") and out["rmtree"] in ("EROFS", "EACCES", "EBUSY"), out
    assert out["chmod"] in ("EROFS", "EPERM"), out
    assert not any(os.path.exists(on_host[path]) for path in new_files), on_host
    assert Path(on_host[existing]).read_bytes() == before
    assert os.path.isdir(host_path(backend, "/opt/tidal/site/pluggy") or "/usr")


def test_writes_outside_the_workspace_fail(probe: ProbeRunner, backend: SandboxBackend) -> None:
    # The sandbox's own root, /opt/tidal and /dev are private tmpfs folders, read-only or not its own:
    # a file there would shadow a harness module on PYTHONPATH (/opt/tidal/site) for the rest of the
    # run. (/tmp and /dev/shm are its scratch tmpfs: test_escape_resources bounds them.)
    name = f"tidal-probe-{probe.marker}"
    folders = ["/", "/opt", "/opt/tidal", "/opt/tidal/site", "/opt/tidal/harness", "/etc", "/dev", "/proc"]
    result = probe.run(f"""
        report(**{{folder: attempt(lambda: open(os.path.join(folder, {name!r}), "w").write("x")) for folder in {folders!r}}},
               mkdir=attempt(os.mkdir, "/opt/tidal/site/_tidal_probe"), workspace=attempt(open, "/workspace/ok", "w"))
    """)
    out = probe_output(result)
    assert out.pop("workspace") == "ok"
    assert all(outcome in ("EACCES", "EROFS", "EPERM", "ENOENT") for outcome in out.values()), out
    assert out["/proc"] in ("ENOENT", "EACCES"), out
    site = host_path(backend, "/opt/tidal/site")
    assert site is None or not os.path.exists(os.path.join(site, name))


def test_symlinks_in_the_workspace_do_not_reach_host_files(probe: ProbeRunner, host_secret: HostSecret) -> None:
    # The host reads and deletes the workspace after the run: neither may follow a link out of it.
    secret_dir = str(host_secret.path.parent)
    result = probe.run(f"""
        os.symlink({str(host_secret.path)!r}, "link_to_secret")
        os.symlink({secret_dir!r}, "link_to_dir")
        os.symlink("/", "link_to_root")
        os.mkdir("locked")
        os.symlink({secret_dir!r}, "locked/inner")
        os.chmod("locked", 0)
        report(read=attempt(open, "link_to_secret"))
    """, after=lambda workspace: sorted(p.name for p in workspace.iterdir()))
    assert probe_output(result) == {"read": "ENOENT"}
    assert result.after_value == ["link_to_dir", "link_to_root", "link_to_secret", "locked", "probe.py"]
    assert host_secret.path.read_text() == host_secret.value  # cleanup removed the links, not their targets


def test_proc_sys_is_not_writable(probe: ProbeRunner) -> None:
    hostname = socket.gethostname()
    result = probe.run("""
        import socket
        paths = ["/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/core_pattern",
                 "/proc/sys/kernel/modprobe", "/proc/sys/fs/binfmt_misc/register"]
        report(hostname=socket.gethostname(), sethostname=attempt(socket.sethostname, "pwned"),
               **{path: attempt(lambda: open(path, "w").write("|/workspace/pwn")) for path in paths})
    """)
    out = probe_output(result)
    assert out.pop("hostname") == "sandbox" and out.pop("sethostname") == "EPERM"
    assert all(outcome in ("EACCES", "EROFS", "EPERM", "ENOENT") for outcome in out.values()), out
    assert out["/proc/sys/kernel/core_pattern"] in ("EACCES", "EROFS", "EPERM"), out
    assert socket.gethostname() == hostname
    assert "pwn" not in Path("/proc/sys/kernel/core_pattern").read_text()


def test_chown_and_setuid_games_stay_inside(probe: ProbeRunner) -> None:
    def host_view(workspace: Path) -> dict[str, tuple[int, int, int]]:
        return {p.name: (p.lstat().st_uid, p.lstat().st_gid, p.lstat().st_mode & 0o7777) for p in workspace.iterdir()}

    result = probe.run("""
        open("tool", "w").write("#!/bin/sh\\nid -u\\n")
        os.chmod("tool", 0o6755)
        report(to_root=attempt(os.chown, "tool", 0, 0), to_unmapped=attempt(os.chown, "tool", 1000, 1000),
               group_root=attempt(os.chown, "tool", -1, 0), link_su=attempt(os.link, "/usr/bin/su", "su"),
               mknod=attempt(os.mknod, "disk", 0o600 | 0o060000, os.makedev(8, 0)))
    """, after=host_view)
    out = probe_output(result)
    assert out["to_root"] == "EPERM" and out["group_root"] == "EPERM", out
    assert out["to_unmapped"] == "EINVAL", out
    assert out["link_su"] in ("EXDEV", "EPERM"), out  # /usr is another mount; hard links need ownership
    assert out["mknod"] == "EPERM", out
    uid, gid, _ = result.after_value["tool"]
    # On the host the file belongs to the sandbox user (a setuid-nobody file, in a folder deleted next).
    assert (uid, gid) == ((65534, 65534) if os.geteuid() == 0 else (os.geteuid(), os.getegid()))
    assert set(result.after_value) == {"probe.py", "tool"}


def test_dev_holds_only_harmless_devices(probe: ProbeRunner) -> None:
    result = probe.run("""
        import stat
        entries = {}
        for name in os.listdir("/dev"):
            mode = os.lstat(os.path.join("/dev", name)).st_mode
            entries[name] = "block" if stat.S_ISBLK(mode) else "char" if stat.S_ISCHR(mode) else "other"
        report(entries=entries, kmsg=attempt(open, "/dev/kmsg"), mem=attempt(open, "/dev/mem"))
    """)
    out = probe_output(result)
    chars = {name for name, kind in out["entries"].items() if kind == "char"}
    assert chars <= {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "console"}, out["entries"]
    assert "block" not in out["entries"].values()
    assert out["kmsg"] == out["mem"] == "ENOENT"
