"""Fixtures for the load-generator tests."""

from __future__ import annotations

import pytest
from fake_openai import FakeOpenAI


@pytest.fixture
def fake() -> FakeOpenAI:
    return FakeOpenAI()
