"""The e2b provider's pure parts: error translation for the fallback chain, exit codes, templates, configuration."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from e2b import (
    AuthenticationException,
    FileNotFoundException,
    InvalidArgumentException,
    RateLimitException,
    SandboxException,
    ServiceBusyException,
)

from corral.errors import (
    FileOperationError,
    ProviderUnavailableError,
    ResourceLimitError,
    WorkspaceFileNotFoundError,
)
from corral.providers.base import WorkspaceProvider, WorkspaceSpec
from corral.providers.e2b import E2BProvider, _exit_code, from_settings
from corral.settings import Settings

pytestmark = pytest.mark.unit


@pytest.fixture
def provider() -> E2BProvider:
    return E2BProvider(api_key="key", default_image="corral/workspace:base")


def _quota() -> SandboxException:
    error = SandboxException("429: too many sandboxes")
    error.status_code = 429
    return error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (AuthenticationException("401: Unauthorized"), ProviderUnavailableError),
        (RateLimitException("429: Rate limit exceeded"), ResourceLimitError),  # type: ignore[no-untyped-call]
        (_quota(), ResourceLimitError),
        (ServiceBusyException("503: busy"), ProviderUnavailableError),
        (SandboxException("500: internal"), ProviderUnavailableError),
        (httpx.ConnectError("connection refused"), ProviderUnavailableError),
        (ConnectionRefusedError("refused"), ProviderUnavailableError),
        (RuntimeError("surprise"), ProviderUnavailableError),
    ],
)
def test_api_failures_become_fallback_errors(provider: E2BProvider, error: Exception, expected: type) -> None:
    """API errors, unreachable hosts and rate limits or quotas map to the errors that let auto selection fall back."""
    translated = provider._translate(error)
    assert type(translated) is expected
    if isinstance(translated, ProviderUnavailableError):
        assert translated.provider == "e2b"


def test_file_errors_keep_their_meaning(provider: E2BProvider) -> None:
    """In file operations a missing path and an invalid argument become the contract's file errors."""
    assert isinstance(provider._translate(FileNotFoundException("nope"), "w", files=True), WorkspaceFileNotFoundError)
    assert isinstance(provider._translate(InvalidArgumentException("dir"), "w", files=True), FileOperationError)


def test_signalled_exit_codes_read_like_a_shell() -> None:
    """envd's -1 with "signal: killed" becomes 137 (128 + 9); ordinary codes pass through."""
    assert _exit_code(-1, "signal: killed") == 137
    assert _exit_code(-1, "signal: terminated") == 143
    assert _exit_code(3, "exit status 3") == 3
    assert _exit_code(-1, "something else") == -1


def test_templates_follow_the_image(provider: E2BProvider) -> None:
    """Corral's base image means the configured template; any other image names the template itself."""
    assert provider.template_for(WorkspaceSpec(id="a", image="corral/workspace:base")) == "base"
    assert provider.template_for(WorkspaceSpec(id="a", image="my-template")) == "my-template"


async def test_health_without_a_key_is_unhealthy_without_calling_out() -> None:
    """Without E2B_API_KEY the provider reports unhealthy at once, naming the variable."""
    health = await E2BProvider(api_key=None).health()
    assert health.healthy is False
    assert health.error is not None
    assert "E2B_API_KEY" in health.error


def test_from_settings_and_protocol(tmp_path: Path) -> None:
    """from_settings builds a provider that satisfies the WorkspaceProvider protocol from E2B_API_KEY alone."""
    settings = Settings(data_dir=tmp_path, e2b_api_key="secret")
    provider = from_settings(settings)
    assert isinstance(provider, WorkspaceProvider)
    assert (provider.api_key, provider.template, provider.owner) == ("secret", "base", settings.owner_id())
