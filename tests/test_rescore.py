"""`gymflow rescore`: a run's stored episodes verified again with a changed verifier into a new score version;
the collect's own scores kept; an interrupted rescore, run again, verifies only what it had not stored; report and
diff read a chosen version. Against the real stack (Temporal, Postgres, the pools) and supervised processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from gymflow.environments import registry

from gymflow.cli.main import cli
from gymflow.kernel.wire import ChatMessage, Task
from gymflow.rescore import rescore_run
from gymflow.testing.scripted_openai import text
from tests.rescore_env import ENTRY_POINT, NAME, rescore_env  # noqa: F401 - rescore_env: a fixture


def _task(task_id: str, says: str) -> Task:
    return Task(id=task_id, env=NAME, messages=(ChatMessage(role="user", content=f"please say {says}"),))


@pytest.fixture
def says_what_it_is_asked(scripted):
    scripted.responder = lambda body: text(body["messages"][-1]["content"].removeprefix("please say "))
    yield
    scripted.responder = None


@pytest.fixture
async def collected(gf, run_id, rescore_env, says_what_it_is_asked, monkeypatch):  # noqa: F811
    real = registry.available  # listed as installed, so the collect's up-front check accepts it
    monkeypatch.setattr(registry, "available", lambda: {**real(), NAME: ENTRY_POINT.value})
    tasks = [_task("a", "yes"), _task("b", "no"), _task("c", "yes")]
    results = [r.summary async for r in gf.collect(run_id, tasks, n=2, model="policy")]
    assert sorted((s.task_id, s.reward) for s in results) == [("a", 1.0), ("a", 1.0), ("b", 0.0), ("b", 0.0),
                                                             ("c", 1.0), ("c", 1.0)]
    return run_id


async def test_a_changed_verifier_rescores_into_a_new_version_and_keeps_the_old(collected, settings, sql, tmp_path):
    log = tmp_path / "calls"
    overrides = {NAME: {"accept": "no", "calls_log": str(log)}}
    # Interrupted after 2 stored scores; the rerun (same name) verifies only the other 4.
    first = await rescore_run(settings, collected, name="accept-no", overrides=overrides, concurrency=1,
                              stop_after=2)
    assert (first.scored, first.finished, first.resumed) == (2, False, False)
    second = await rescore_run(settings, collected, name="accept-no", overrides=overrides, concurrency=3)
    assert (second.scored, second.already, second.finished, second.resumed) == (4, 2, True, True)
    assert len(log.read_text().splitlines()) == 6, "each episode verified once across both calls"
    rescored = dict(sql("SELECT rollout_id, reward FROM rescored WHERE score_version = %s", f"{collected}@accept-no"))
    assert len(rescored) == 6 and sorted(rescored.values()) == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    # The collect's own scores are untouched.
    kept = sql("SELECT task_id, reward FROM rollouts WHERE run_id = %s ORDER BY task_id, sample_index", collected)
    assert [r for _, r in kept] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    (version,) = sql("SELECT name, ordinal, verifiers, options, finished_at IS NOT NULL FROM score_versions "
                     "WHERE run_id = %s", collected)
    assert version[:2] == ("accept-no", 1) and version[4]
    assert version[2][NAME]["module"] == "tests.rescore_env" and len(version[2][NAME]["source_sha256"]) == 16
    assert version[3] == {NAME: overrides[NAME]}
    # Resuming it with other options is refused: it would mix two verifiers in one version.
    with pytest.raises(ValueError, match="other verifiers or options"):
        await rescore_run(settings, collected, name="accept-no", overrides={NAME: {"accept": "maybe"}})


def test_the_cli_diffs_versions_and_the_report_reads_one(collected, config_file: Path):
    runner = CliRunner()
    done = runner.invoke(cli, ["rescore", collected, "--option", f"{NAME}.accept=no", "-c", str(config_file)])
    assert done.exit_code == 0, done.output
    assert "score version v1 (new): 6 scored now, 0 before" in done.output
    assert "6 rollout(s) changed reward or mask from collected to v1" in done.output
    listed = runner.invoke(cli, ["rescore", collected, "--list", "-c", str(config_file)])
    assert "collected" in listed.output and "v1" in listed.output, listed.output
    latest = runner.invoke(cli, ["report", collected, "-c", str(config_file)])
    assert "score version v1" in latest.output, latest.output
    assert "pass@k" in latest.output
    own = runner.invoke(cli, ["report", collected, "--score", "collected", "-c", str(config_file)])
    assert own.exit_code == 0 and "score version" not in own.output
    assert _mean(latest.output) == pytest.approx(1 / 3, abs=1e-3)
    assert _mean(own.output) == pytest.approx(2 / 3, abs=1e-3)
    unknown = runner.invoke(cli, ["report", collected, "--score", "v9", "-c", str(config_file)])
    assert unknown.exit_code != 0 and "has no score version 'v9'" in unknown.output
    bad = runner.invoke(cli, ["rescore", collected, "--option", "accept=no", "-c", str(config_file)])
    assert bad.exit_code != 0 and "expected ENV.KEY=VALUE" in bad.output
    typo = runner.invoke(cli, ["rescore", collected, "--option", f"{NAME}.acept=no", "-c", str(config_file)])
    assert typo.exit_code != 0 and f"environments.{NAME}.acept: unknown option" in typo.output


async def test_an_unknown_run_is_a_clear_error(settings):
    with pytest.raises(Exception, match="run 'no-such-run' has no stored rollouts"):
        await rescore_run(settings, "no-such-run")


def _mean(output: str) -> float:
    """The mean reward `gymflow report` prints ("mean reward  0.333 over 6 scored rollouts")."""
    for line in output.splitlines():
        if "mean reward" in line:
            return float(line.split("mean reward", 1)[1].split()[0])
    raise AssertionError(output)
