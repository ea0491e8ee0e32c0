"""Where the settings point Redis: one server, or a primary named by Redis Sentinel; a
missing or malformed Sentinel setting is a one-line error naming it."""

from __future__ import annotations

import pytest

from dagsched.redis_connect import RedisEndpoint
from dagsched.settings import SettingsError, load_settings


def endpoint(**overrides: object) -> RedisEndpoint:
    return RedisEndpoint.of(load_settings(None, overrides, environ={}))


def test_a_url_alone_is_one_server() -> None:
    end = endpoint(redis_url="redis://10.0.0.5:6380/2")
    assert not end.uses_sentinel
    assert end.describe() == "redis://10.0.0.5:6380/2"


def test_sentinels_from_a_list_or_one_comma_separated_variable() -> None:
    listed = endpoint(redis_sentinels=["s1:26379", "s2:26380"], redis_master_name="main")
    env = RedisEndpoint.of(
        load_settings(
            None,
            environ={
                "DAGSCHED_REDIS_SENTINELS": "s1:26379, s2:26380",
                "DAGSCHED_REDIS_MASTER_NAME": "main",
            },
        )
    )
    assert listed == env
    assert listed.sentinels == (("s1", 26379), ("s2", 26380))
    assert listed.describe() == "sentinel main via s1:26379,s2:26380"


def test_the_url_still_gives_database_and_password_with_sentinels() -> None:
    end = endpoint(
        redis_url="redis://app:s%40cret@ignored:1/3",
        redis_sentinels=["[::1]:26379"],
        redis_master_name="main",
    )
    assert end.server_options() == {"db": 3, "username": "app", "password": "s@cret"}
    assert end.sentinels == (("::1", 26379),)


SENTINEL = {"redis_master_name": "m"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"redis_sentinels": ["s1"], **SENTINEL}, "redis_sentinels: a sentinel is HOST:PORT"),
        ({"redis_sentinels": ["s1:0"], **SENTINEL}, "a sentinel is HOST:PORT, got 's1:0'"),
        ({"redis_sentinels": ["s:1"]}, "redis_master_name: required when redis_sentinels is set"),
        (SENTINEL, "redis_sentinels: required when redis_master_name is set"),
        ({"redis_wait_replicas": -1}, "redis_wait_replicas: Input should be greater than or"),
    ],
)
def test_a_bad_sentinel_setting_is_one_line_naming_it(overrides: dict, message: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(None, overrides, environ={})
    text = str(err.value)
    assert message in text and "\n" not in text
