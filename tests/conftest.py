"""Shared test settings: the real Redis the tests use."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Tests use their own Redis database so that they never see (or eat) a running product's tasks.
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    client = redis.Redis.from_url(TEST_REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"these tests need a Redis server at {TEST_REDIS_URL} ({exc}); scripts/test.sh starts one")
    return TEST_REDIS_URL
