"""Per-step Python environments with real uv, real wheels and real runs of the command line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marinbuild.errors import StepDefinitionError
from marinbuild.pyenv.builder import MANIFEST, EnvBuildError, ensure, env_key
from marinbuild.pyenv.inventory import cached_envs, prune
from marinbuild.pyenv.spec import expand_groups

from .helpers import cli_env, marinbuild, marinbuild_in_process, plan_json, status_of, write_marinfile
from .wheels import direct_reference, make_wheel

pytest_plugins = ["tests.fixtures_ray"]

MARINFILE = """
import os
from marinbuild import step, this_output_path

def use_tiny(cfg):
    import sys
    import tinypkg
    with open(os.path.join(cfg["out"], "value.txt"), "w") as f:
        f.write(f"{{tinypkg.VALUE}} {{sys.prefix}}")

fn = step("fn", use_tiny, {{"out": this_output_path()}}, pip_dependency_groups=[{req!r}])
sh = step("sh", cmd="python -c 'import tinypkg; print(tinypkg.VALUE)' > {{output}}/value.txt; echo $VIRTUAL_ENV >> {{output}}/value.txt",
          pip_dependency_groups=[{req!r}])
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty environment cache of this test, for the test and the runners it starts."""
    root = tmp_path / "envs"
    monkeypatch.setenv("MARINBUILD_ENV_CACHE", str(root))
    return root


@pytest.fixture
def wheel(tmp_path):
    return make_wheel(tmp_path / "wheels")


def ready_envs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / MANIFEST).is_file()) if root.exists() else []


def leftovers(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith(".tmp-")) if root.exists() else []


def test_steps_import_a_package_the_runner_lacks(project, cache, wheel):
    assert importlib.util.find_spec("tinypkg") is None  # the runner's own environment lacks it
    write_marinfile(project, MARINFILE.format(req=direct_reference(wheel)))
    result = marinbuild("run", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = plan_json(project)
    (env_dir,) = ready_envs(cache)  # both steps asked for the same set: one environment
    fn_value = (Path(rows["fn"]["output_path"]) / "value.txt").read_text().split()
    assert fn_value == ["42", str(env_dir)]  # the function ran under the environment's interpreter
    sh_value = (Path(rows["sh"]["output_path"]) / "value.txt").read_text().split()
    assert sh_value == ["42", str(env_dir)]  # the shell step found its python first on PATH
    info = json.loads((Path(rows["fn"]["output_path"]) / ".marinbuild" / "info.json").read_text())
    assert info["environment"]["key"] == env_dir.name
    assert info["environment"]["requirements"] == [direct_reference(wheel)]
    assert rows["fn"]["environment"]["key"] == env_dir.name  # plan shows it too


def test_a_second_run_builds_nothing(project, cache, wheel):
    write_marinfile(project, MARINFILE.format(req=direct_reference(wheel)))
    assert marinbuild("run", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)}).returncode == 0
    (env_dir,) = ready_envs(cache)
    manifest = (env_dir / MANIFEST).stat()
    entries = sorted(p.name for p in cache.iterdir())
    again = marinbuild("run", "-F", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert again.returncode == 0, again.stderr
    # The same folder, its manifest never rewritten, nothing new beside it.
    assert ready_envs(cache) == [env_dir]
    after = (env_dir / MANIFEST).stat()
    assert (after.st_ino, after.st_mtime_ns) == (manifest.st_ino, manifest.st_mtime_ns)
    assert sorted(p.name for p in cache.iterdir()) == entries
    rows = plan_json(project)
    folders = [Path(rows[name]["output_path"]) / "logs" for name in ("fn", "sh")]
    # The first run's log was moved aside by the second run; only the first run built, in the log
    # of whichever step took the environment's lock first.
    assert all("uv venv" not in (logs / "step.log").read_text() for logs in folders)
    assert sum(p.read_text().count("uv venv") for logs in folders for p in logs.glob("*.log")) == 1


def test_two_runners_needing_the_same_new_environment_build_it_once(project, cache, wheel):
    write_marinfile(project, MARINFILE.format(req=direct_reference(wheel)))
    env = cli_env({"MARINBUILD_ENV_CACHE": str(cache)})
    # Different prefixes: no lease keeps the runners apart, only the environment is shared.
    runners = [
        subprocess.Popen([sys.executable, "-m", "marinbuild", "run", "--prefix", str(project / f"out{i}"), "fn"],
                         cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    for r in runners:
        _, err = r.communicate(timeout=120)
        assert r.returncode == 0, err
    assert len(ready_envs(cache)) == 1
    assert leftovers(cache) == []
    logs = [next((project / f"out{i}").glob("fn-*/logs/step.log")).read_text() for i in range(2)]
    assert sorted(log.count("uv venv") for log in logs) == [0, 1]
    for i in range(2):
        assert next((project / f"out{i}").glob("fn-*/value.txt")).read_text().startswith("42 ")


def test_an_extra_of_the_project_pyproject(project, cache, wheel):
    (project / "pyproject.toml").write_text(textwrap.dedent(f"""
        [project]
        name = "demo"
        version = "0"
        [project.optional-dependencies]
        tiny = [{direct_reference(wheel)!r}]
        both = ["demo[tiny]"]
    """))
    write_marinfile(project, """
from marinbuild import step
step("uses-extra", cmd="python -c 'import tinypkg' && echo ok > {output}/ok", pip_dependency_groups=["both"])
""")
    result = marinbuild("run", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert result.returncode == 0, result.stdout + result.stderr
    out = Path(plan_json(project)["uses-extra"]["output_path"])
    assert (out / "ok").read_text() == "ok\n"
    assert expand_groups("uses-extra", ["both"], str(project / "pyproject.toml")) == (direct_reference(wheel),)


def test_an_unknown_extra_is_refused_at_plan_time_naming_the_step_and_the_extras(project, cache):
    (project / "pyproject.toml").write_text('[project]\nname = "demo"\n[project.optional-dependencies]\nrl = []\neval = []\n')
    write_marinfile(project, """
from marinbuild import step
step("train", cmd="true", pip_dependency_groups=["rll"])
""")
    result = marinbuild_in_process("plan", cwd=project)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "'train'" in line and "'rll'" in line and "extras: eval, rl" in line
    assert "Traceback" not in result.stderr and len(line.splitlines()) == 1
    assert not cache.exists()
    with pytest.raises(StepDefinitionError, match=r"no pyproject\.toml"):
        expand_groups("train", ["rl"], None)


@pytest.mark.parametrize(
    "entry, why",
    [
        ("tinypkg\n--index-url http://127.0.0.1:9/simple", "line break"),
        ("tinypkg\r-r /etc/passwd", "line break"),
        ("-r /etc/passwd", "installer option"),
        ("--index-url=http://127.0.0.1:9/simple", "installer option"),
        ("tinypkg --extra-index-url http://127.0.0.1:9/simple", "not a PEP 508 requirement"),
        ("tinypkg # a comment", "not a PEP 508 requirement"),
    ],
)
def test_an_entry_that_is_not_one_requirement_is_refused_at_plan_time(project, cache, entry, why):
    write_marinfile(project, f"""
from marinbuild import step
step("train", cmd="true", pip_dependency_groups={[entry]!r})
""")
    for command in ("plan", "run"):
        result = marinbuild_in_process(command, cwd=project)
        assert result.returncode == 2, result.stdout + result.stderr
        line = result.stderr.strip()
        assert line.startswith("marinbuild: error: step 'train': pip_dependency_groups entry ") and why in line, line
        assert "Traceback" not in result.stderr and len(line.splitlines()) == 1
    assert not cache.exists()  # uv was never asked
    assert not (project / "marinbuild-out").exists()


def test_an_extra_holding_an_option_is_refused_naming_the_extra(project, cache):
    (project / "pyproject.toml").write_text('[project]\nname = "demo"\n[project.optional-dependencies]\nrl = ["-r /etc/passwd"]\n')
    write_marinfile(project, 'from marinbuild import step\nstep("train", cmd="true", pip_dependency_groups=["rl"])\n')
    result = marinbuild_in_process("plan", cwd=project)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "step 'train': extra 'rl' of " in line and "'-r /etc/passwd' is an installer option" in line, line
    assert not cache.exists()


def test_an_unresolvable_requirement_fails_its_step_and_keep_going_finishes_the_rest(project, cache, wheel):
    conflict = [direct_reference(wheel), "tinypkg>=2"]
    write_marinfile(project, f"""
from marinbuild import step
step("broken", cmd="true", pip_dependency_groups={conflict!r})
step("fine", cmd="echo done > {{output}}/done")
""")
    result = marinbuild("run", "-k", "-j", "1", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert result.returncode == 1
    rows = plan_json(project)
    broken = status_of(rows["broken"]["output_path"])
    assert broken["status"] == "FAILED"
    assert "could not be built" in broken["error"] and "unsatisfiable" in broken["error"]
    log = (Path(rows["broken"]["output_path"]) / "logs" / "step.log").read_text()
    assert "tinypkg>=2" in log  # the resolver's last lines are in the step's log
    assert (Path(rows["fine"]["output_path"]) / "done").read_text() == "done\n"
    assert ready_envs(cache) == [] and leftovers(cache) == []  # nothing cached as good
    attempts = json.loads((Path(rows["broken"]["output_path"]) / "attempts.json").read_text())["attempts"]
    assert [a["class"] for a in attempts] == ["FAILED"]


def test_a_function_step_in_an_environment_fails_with_its_own_error_and_is_retried(project, cache, wheel):
    write_marinfile(project, f"""
import os
from marinbuild import step

def flaky(cfg):
    import tinypkg
    if os.environ["MARINBUILD_ATTEMPT"] == "1":
        raise ValueError(f"bad data {{tinypkg.VALUE}}")
    open(os.path.join(os.environ["MARINBUILD_OUTPUT"], "ok"), "w").close()

step("flaky", flaky, pip_dependency_groups=[{direct_reference(wheel)!r}], max_retries_failure=1)
step("broken", flaky, pip_dependency_groups=[{direct_reference(wheel)!r}])
""")
    result = marinbuild("run", "-k", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache),
                                                       "MARINBUILD_RETRY_BASE_DELAY": "0.01"})
    assert result.returncode == 1
    rows = plan_json(project)
    assert status_of(rows["broken"]["output_path"])["error"] == "ValueError: bad data 42"
    flaky_out = Path(rows["flaky"]["output_path"])
    assert (flaky_out / "ok").exists()
    attempts = json.loads((flaky_out / "attempts.json").read_text())["attempts"]
    assert [(a["class"], a["message"]) for a in attempts] == [("FAILED", "ValueError: bad data 42"), ("SUCCESS", "")]
    assert len(ready_envs(cache)) == 1


def test_ensure_fails_cleanly_and_reports_the_resolvers_last_lines(tmp_path, wheel):
    with pytest.raises(EnvBuildError) as caught:
        ensure([direct_reference(wheel), "tinypkg>=2"], root=tmp_path / "c")
    assert "unsatisfiable" in caught.value.tail
    assert [p.name for p in (tmp_path / "c").iterdir()] == [f"{env_key([direct_reference(wheel), 'tinypkg>=2'])}.lock"]


def test_the_key_follows_the_bytes_of_a_referenced_wheel(tmp_path):
    first = make_wheel(tmp_path / "w", code="VALUE = 1\n")
    key = env_key([direct_reference(first)])
    assert env_key([direct_reference(first)]) == key
    make_wheel(tmp_path / "w", code="VALUE = 2\n")  # rebuilt under the same name and version
    assert env_key([direct_reference(first)]) != key


def test_env_build_list_and_prune(project, cache, wheel):
    write_marinfile(project, MARINFILE.format(req=direct_reference(wheel)))
    built = marinbuild("env", "build", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert built.returncode == 0, built.stderr
    (env_dir,) = ready_envs(cache)
    assert f"{env_dir.name}  built" in built.stdout
    again = marinbuild("env", "build", "sh", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert f"{env_dir.name}  cached" in again.stdout
    listed = marinbuild_in_process("env", "list", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert env_dir.name in listed.stdout and "tinypkg @ file://" in listed.stdout
    [entry] = cached_envs(cache)
    assert entry.size > 0 and entry.requirements == (direct_reference(wheel),)
    # Still used by the Marinfile: kept. Once no step asks for it: removed.
    kept = marinbuild("env", "prune", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert kept.returncode == 0 and "nothing to remove" in kept.stdout and env_dir.exists()
    write_marinfile(project, 'from marinbuild import step\nstep("plain", cmd="true")\n')
    pruned = marinbuild("env", "prune", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert pruned.returncode == 0 and f"removed {env_dir}" in pruned.stdout
    assert ready_envs(cache) == [] and leftovers(cache) == []
    assert prune(set(), root=cache) == []


def test_the_runners_packages_stay_importable_behind_the_environments_own(tmp_path, wheel):
    env_dir = ensure([direct_reference(wheel)], root=tmp_path / "c")
    probe = "import marinbuild, tinypkg, xxhash; print(tinypkg.VALUE)"
    done = subprocess.run([str(env_dir / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                          cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"


# -- remote backends: TPU hosts over SSH (real sshd on loopback) and a real Ray cluster ------------

REMOTE_MARINFILE = """
import os, sys
from marinbuild import step, ResourceConfig, this_output_path

def on_host(cfg):
    import tinypkg
    worker = os.environ["MARINBUILD_WORKER_ID"]
    with open(os.path.join(cfg["out"], f"fn{{worker}}.txt"), "w") as f:
        f.write(f"{{tinypkg.VALUE}} {{sys.prefix}} {{os.environ['FOO']}} {{os.environ['OMP_NUM_THREADS']}}")

tpu = ResourceConfig.with_tpu("v4-16", env_vars={{"FOO": "from-env-vars", "OMP_NUM_THREADS": "3"}})
step("tpu/sh", cmd="python -c 'import tinypkg, sys; print(tinypkg.VALUE, sys.prefix)' > {{output}}/sh$MARINBUILD_WORKER_ID.txt",
     pip_dependency_groups=[{req!r}], resources=tpu)
step("tpu/fn", on_host, {{"out": this_output_path()}}, pip_dependency_groups=[{req!r}], resources=tpu)
"""


def host_envs(fleet, index: int) -> list[Path]:
    return ready_envs(fleet.hosts[index].home / ".cache" / "marinbuild" / "envs")


def test_the_environment_is_built_on_every_ssh_host_once(project, fleet, wheel, cache):
    write_marinfile(project, REMOTE_MARINFILE.format(req=direct_reference(wheel)))
    cluster = fleet.write_cluster(project / "cluster.toml", [("a", "v4-16", [0, 1])], python=sys.executable)
    env = {"MARINBUILD_RETRY_BASE_DELAY": "0.05", "MARINBUILD_ENV_CACHE": str(cache)}
    for h in (0, 1):  # earlier tests on the session's hosts must not have built it already
        for old in host_envs(fleet, h):
            subprocess.run(["rm", "-rf", str(old)], check=True)
    result = marinbuild("run", "-j", "1", "--cluster", str(cluster), cwd=project, env=env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = plan_json(project, "--cluster", str(cluster))
    key = rows["tpu/sh"]["environment"]["key"]
    built = [host_envs(fleet, h) for h in (0, 1)]
    assert [[p.name for p in b] for b in built] == [[key], [key]]  # each host its own, by the same hash
    assert not ready_envs(cache)  # the runner built nothing for them
    sh_out, fn_out = Path(rows["tpu/sh"]["output_path"]), Path(rows["tpu/fn"]["output_path"])
    for w in (0, 1):
        assert (sh_out / f"sh{w}.txt").read_text().split() == ["42", str(built[w][0])]
        value, prefix, foo, threads = (fn_out / f"fn{w}.txt").read_text().split()
        assert (value, prefix, foo, threads) == ("42", str(built[w][0]), "from-env-vars", "3")
    stamps = [(b[0] / MANIFEST).stat().st_mtime_ns for b in built]
    again = marinbuild("run", "-F", "-j", "1", "--cluster", str(cluster), cwd=project, env=env, timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [host_envs(fleet, h) for h in (0, 1)] == built
    assert [(b[0] / MANIFEST).stat().st_mtime_ns for b in built] == stamps  # no work the second time
    homes = [fleet.hosts[h].home / ".cache" / "marinbuild" / "envs" for h in (0, 1)]
    assert all(leftovers(home) == [] for home in homes)


RAY_MARINFILE = """
import os
from marinbuild import step, ResourceConfig, this_output_path

def on_ray(cfg):
    import tinypkg
    with open(os.path.join(cfg["out"], "value.txt"), "w") as f:
        f.write(f"{{tinypkg.VALUE}} {{os.environ['FOO']}} {{os.environ['MARINBUILD_ATTEMPT']}}")

step("ray/fn", on_ray, {{"out": this_output_path()}}, pip_dependency_groups=[{req!r}],
     resources=ResourceConfig.with_cpu(1, ram=None, env_vars={{"FOO": "from-env-vars"}}))
step("ray/flaky", cmd='test "$MARINBUILD_ATTEMPT" != 1 && echo "$FOO" > {{output}}/ok',
     resources=ResourceConfig.with_cpu(1, ram=None, env_vars={{"FOO": "second"}}), max_retries_failure=1)
"""


def test_the_environment_env_vars_and_retries_on_a_real_ray_cluster(ray_cluster, project, wheel, cache):
    write_marinfile(project, RAY_MARINFILE.format(req=direct_reference(wheel)))
    env = {**ray_cluster.env, "MARINBUILD_LEASE_POLL": "0.5", "MARINBUILD_RETRY_BASE_DELAY": "0.05",
           "MARINBUILD_ENV_CACHE": str(cache), "FOO": "from-the-runner"}
    result = marinbuild("run", "--backend", "ray", "--ray-address", ray_cluster.address, cwd=project, env=env,
                        timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = plan_json(project)
    fn_out, flaky_out = Path(rows["ray/fn"]["output_path"]), Path(rows["ray/flaky"]["output_path"])
    assert (fn_out / "value.txt").read_text() == "42 from-env-vars 1"  # env_vars win over the runner's FOO
    info = json.loads((fn_out / ".marinbuild" / "info.json").read_text())
    assert info["ray"]["node_id"] and info["environment"]["key"] == rows["ray/fn"]["environment"]["key"]
    assert not ready_envs(cache)  # Ray installed the requirements on its node, not the runner
    assert (flaky_out / "ok").read_text() == "second\n"
    attempts = json.loads((flaky_out / "attempts.json").read_text())["attempts"]
    assert [(a["attempt"], a["class"], a["exit_code"]) for a in attempts] == [(1, "FAILED", 1), (2, "SUCCESS", 0)]
    assert all(a["host"] for a in attempts) and attempts[0]["ended_at"] <= attempts[1]["started_at"]


def test_a_host_without_uv_gets_it_once_and_then_builds(project, fleet, wheel, tmp_path):
    # The host's Python cannot import the uv package and no uv is on its PATH (sshd's default),
    # so the host installs uv from PyPI (the one download this test makes).
    hidden = tmp_path / "hide-uv"
    hidden.mkdir()
    (hidden / "uv.py").write_text('raise ImportError("uv is hidden on this host")\n')
    python = tmp_path / "python-without-uv"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={hidden} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    write_marinfile(project, f"""
from marinbuild import step, ResourceConfig
step("tpu/sh", cmd="python -c 'import tinypkg'",
     pip_dependency_groups=[{direct_reference(wheel)!r}], resources=ResourceConfig.with_tpu("v4-8"))
""")
    cluster = fleet.write_cluster(project / "cluster.toml", [("a", "v4-8", [2])], python=str(python))
    cache = fleet.hosts[2].home / ".cache" / "marinbuild" / "envs"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    result = marinbuild("run", "--cluster", str(cluster), cwd=project, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    brought = cache / ".uv" / "bin" / "uv"
    assert brought.is_file()  # installed from PyPI into the host's cache, once
    assert len(ready_envs(cache)) == 1
    stamp = brought.stat().st_mtime_ns
    again = marinbuild("run", "-F", "--cluster", str(cluster), cwd=project, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert brought.stat().st_mtime_ns == stamp


def test_a_damaged_environment_is_noticed_before_use_and_rebuilt(project, cache, wheel):
    write_marinfile(project, MARINFILE.format(req=direct_reference(wheel)))
    assert marinbuild("run", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)}).returncode == 0
    (env_dir,) = ready_envs(cache)
    (env_dir / "bin" / "python").unlink()  # a hand, or a cleaner, damaged the cached environment
    again = marinbuild("run", "-F", cwd=project, env={"MARINBUILD_ENV_CACHE": str(cache)})
    assert again.returncode == 0, again.stdout + again.stderr
    assert ready_envs(cache) == [env_dir] and (env_dir / "bin" / "python").is_file()  # rebuilt under its key
    assert leftovers(cache) == []
    rows = plan_json(project)
    for name in ("fn", "sh"):  # both ran under the rebuilt environment's interpreter, not the runner's
        assert (Path(rows[name]["output_path"]) / "value.txt").read_text().split() == ["42", str(env_dir)]
    # Whichever of the two steps takes the environment's lock first builds it and logs the build.
    logs = [p for name in ("fn", "sh") for p in (Path(rows[name]["output_path"]) / "logs").glob("*.log")]
    assert sum(p.read_text().count("uv venv") for p in logs) == 2  # built, then rebuilt once
