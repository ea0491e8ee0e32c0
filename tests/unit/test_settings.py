"""Layered settings: defaults, profiles, environment, overrides, and one-line errors."""

import dataclasses
import os
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dagsched.settings import (
    Settings,
    SettingsError,
    deep_merge,
    default_config_dir,
    expand_dotted,
    load_settings,
)
from dagsched.sim.config import ScenarioConfig

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No DAGSCHED_* variable from the caller's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("DAGSCHED_"):
            monkeypatch.delenv(name)


def write_configs(tmp_path: Path, **files: object) -> Path:
    """A config dir holding `<name>.yaml` for each keyword (a dict is dumped, a str written)."""
    root = tmp_path / "configs"
    root.mkdir(parents=True)
    for name, content in files.items():
        text = content if isinstance(content, str) else yaml.safe_dump(content)
        (root / f"{name}.yaml").write_text(text)
    return root


def error_of(**kwargs) -> str:
    with pytest.raises(SettingsError) as info:
        load_settings(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- defaults and layering -------------------------------------------------------------------


def test_defaults_load_and_match_the_dataclasses():
    s = load_settings()
    assert s.sim == ScenarioConfig()
    assert s.home == Path(".dagsched")
    assert s.log_level == "INFO"
    assert s.log_json is None
    assert s.profile is None


def test_config_dir_is_the_repo_configs_by_default():
    assert default_config_dir({}) == REPO_CONFIGS
    assert default_config_dir({"DAGSCHED_CONFIG_DIR": "/x"}) == Path("/x")


def assert_spelled_out(doc: dict, cls: type) -> None:
    """Every field of dataclass `cls` (recursively, node groups included) is a key of `doc`."""
    hints = typing.get_type_hints(cls)
    assert set(doc) == {f.name for f in dataclasses.fields(cls)}, cls.__name__
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        item_kind = typing.get_args(kind)[0] if typing.get_origin(kind) is tuple else None
        if dataclasses.is_dataclass(kind):
            assert_spelled_out(doc[f.name], kind)
        elif dataclasses.is_dataclass(item_kind):
            for item in doc[f.name]:
                assert_spelled_out(item, item_kind)


def test_default_yaml_spells_out_every_sim_field():
    doc = yaml.safe_load((REPO_CONFIGS / "default.yaml").read_text())
    assert_spelled_out(doc["sim"], ScenarioConfig)
    assert Settings(**doc).sim == ScenarioConfig()


def test_default_yaml_alone_equals_code_defaults(tmp_path):
    root = write_configs(tmp_path, default=(REPO_CONFIGS / "default.yaml").read_text())
    assert load_settings(config_dir=root) == load_settings(config_dir=write_configs(tmp_path / "x"))


@pytest.mark.parametrize("profile", ["demo", "test", "prod"])
def test_every_shipped_profile_loads(profile):
    s = load_settings(profile)
    assert s.profile == profile


def test_profile_overlays_default():
    s = load_settings("test")
    assert s.sim.workload.workflows == 40
    assert s.sim.workload.load == ScenarioConfig().workload.load  # untouched keys stay default
    assert s.sim.cluster == ScenarioConfig().cluster


def test_profile_from_env(monkeypatch):
    monkeypatch.setenv("DAGSCHED_PROFILE", "test")
    assert load_settings().profile == "test"
    assert load_settings().sim.workload.workflows == 40
    assert load_settings("demo").profile == "demo"  # the argument wins


def test_env_overrides_yaml(monkeypatch):
    monkeypatch.setenv("DAGSCHED_SIM__FAULTS__NODE_FAILURE_PER_HOUR", "0")
    monkeypatch.setenv("DAGSCHED_SIM__WORKLOAD__WORKFLOWS", "7")
    monkeypatch.setenv("DAGSCHED_HOME", "/tmp/state")
    s = load_settings("test")
    assert s.sim.faults.node_failure_per_hour == 0.0
    assert s.sim.workload.workflows == 7
    assert s.home == Path("/tmp/state")


def test_env_json_values_and_partial_mappings(monkeypatch):
    monkeypatch.setenv("DAGSCHED_SIM__WORKLOAD__SIZE", "[4, 10]")
    monkeypatch.setenv("DAGSCHED_SIM__CLUSTER__SPEED__CPU__GPU", "0.3")
    s = load_settings()
    assert s.sim.workload.size == (4, 10)
    assert s.sim.cluster.speed["cpu"] == {**ScenarioConfig().cluster.speed["cpu"], "gpu": 0.3}


def test_overrides_beat_env(monkeypatch):
    monkeypatch.setenv("DAGSCHED_SIM__WORKLOAD__WORKFLOWS", "7")
    assert load_settings(overrides={"sim.workload.workflows": 3}).sim.workload.workflows == 3
    nested = {"sim": {"workload": {"workflows": 4}}, "log_level": "debug"}
    s = load_settings(overrides=nested)
    assert s.sim.workload.workflows == 4
    assert s.log_level == "DEBUG"


def test_the_config_dir_variable_is_not_a_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("DAGSCHED_CONFIG_DIR", str(write_configs(tmp_path, default={})))
    assert load_settings().sim == ScenarioConfig()


def test_a_mistyped_top_level_variable_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("DAGSCHED_REDIS_ULR", "redis://elsewhere:6379/0")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert str(err.value) == "unknown setting redis_ulr (from DAGSCHED_REDIS_ULR)"


def test_settings_are_frozen():
    s = load_settings()
    with pytest.raises(ValidationError):
        s.log_level = "DEBUG"


def test_merge_helpers():
    assert expand_dotted({"a.b": 1, "a.c": 2, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}
    assert deep_merge({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": 9}, "l": [2]}) == {
        "a": {"b": 9, "c": 2},
        "l": [2],
    }


# --- errors ----------------------------------------------------------------------------------


def test_unknown_yaml_key_names_the_key_and_file(tmp_path):
    root = write_configs(tmp_path, default={"sim": {"workload": {"bogus": 1}}})
    msg = error_of(config_dir=root)
    assert msg.startswith("unknown setting sim.workload.bogus")
    assert str(root / "default.yaml") in msg


def test_unknown_top_level_and_profile_key(tmp_path):
    root = write_configs(tmp_path, default={}, test={"sim": {"foo": 1}}, prod={"nope": 1})
    assert error_of(config_dir=root, profile="test").startswith("unknown setting sim.foo")
    assert "test.yaml" in error_of(config_dir=root, profile="test")
    assert error_of(config_dir=root, profile="prod").startswith("unknown setting nope")


def test_unknown_key_inside_a_list_item(tmp_path):
    group = {"kind": "cpu", "count": 1, "cores": 4, "mem_gb": 8, "gpus": 2}
    root = write_configs(tmp_path, default={"sim": {"cluster": {"groups": [group]}}})
    assert error_of(config_dir=root).startswith("unknown setting sim.cluster.groups[0].gpus")


def test_bad_value_names_the_key_path(tmp_path):
    root = write_configs(tmp_path, default={"sim": {"workload": {"load": 5}}})
    assert error_of(config_dir=root).startswith("sim.workload.load: must be in (0, 2]")


def test_bad_type_names_the_key_path(tmp_path):
    root = write_configs(tmp_path, default={"sim": {"faults": {"repair_mean_s": "soon"}}})
    assert error_of(config_dir=root).startswith("sim.faults.repair_mean_s: ")


def test_bad_value_in_a_list_item():
    groups = [{"kind": "tpu", "count": 1, "cores": 4, "mem_gb": 8}]
    msg = error_of(overrides={"sim.cluster.groups": groups})
    assert msg.startswith("sim.cluster.groups[0].kind: must be one of")


def test_bad_value_from_env_names_the_variable(monkeypatch):
    monkeypatch.setenv("DAGSCHED_SIM__WORKLOAD__LOAD", "3")
    msg = error_of()
    assert msg.startswith("sim.workload.load: must be in (0, 2]")
    assert "DAGSCHED_SIM__WORKLOAD__LOAD" in msg


def test_unknown_nested_env_variable_is_reported(monkeypatch):
    monkeypatch.setenv("DAGSCHED_SIM__WORKLOAD__WORKFLOW", "5")  # typo: no trailing s
    msg = error_of()
    assert msg.startswith("unknown setting sim.workload.workflow")
    assert "DAGSCHED_SIM__WORKLOAD__WORKFLOW" in msg


def test_bad_json_in_env(monkeypatch):
    monkeypatch.setenv("DAGSCHED_SIM__WORKLOAD__SIZE", "[4, 10")
    assert error_of().startswith("DAGSCHED_SIM__WORKLOAD__SIZE: invalid JSON")


def test_bad_log_level():
    assert error_of(overrides={"log_level": "loud"}).startswith("log_level: unknown log level")


def test_unknown_profile_lists_the_known_ones():
    msg = error_of(profile="staging")
    assert "unknown profile 'staging'" in msg
    assert "demo, prod, shift, test" in msg


def test_invalid_yaml_names_the_file(tmp_path):
    root = write_configs(tmp_path, default="sim: [unclosed\n")
    assert error_of(config_dir=root).startswith(str(root / "default.yaml"))


def test_yaml_must_be_a_mapping(tmp_path):
    root = write_configs(tmp_path, default="- 1\n- 2\n")
    assert "must be a mapping" in error_of(config_dir=root)


def test_missing_config_dir(tmp_path, monkeypatch):
    assert error_of(config_dir=tmp_path / "nope").startswith("config directory not found")
    monkeypatch.setenv("DAGSCHED_CONFIG_DIR", str(tmp_path / "nope"))
    assert error_of().startswith("config directory not found")


def test_several_errors_are_counted(tmp_path):
    root = write_configs(tmp_path, default={"sim": {"foo": 1, "bar": 2}})
    assert error_of(config_dir=root).endswith("(and 1 more)")
