"""Image references as Docker parses them (``[registry[:port]/]name[:tag][@digest]``), checked before use.

The grammar is the one of Docker's ``distribution/reference`` package, written without ``\\w`` so the same pattern
means the same thing in Python and in the OpenAPI document (JSON Schema patterns are ECMA-262, where ``\\w`` is
ASCII only). A request whose ``base_image`` does not match is bad input (400), never a reason to try another
provider.
"""

from __future__ import annotations

import re

from corral.errors import InvalidRequestError

__all__ = ["IMAGE_REFERENCE_HELP", "IMAGE_REFERENCE_PATTERN", "check_image_reference"]

_ALPHANUMERIC = "[a-z0-9]+"
_SEPARATOR = "(?:[._]|__|-+)"
_PATH_COMPONENT = f"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_DOMAIN_COMPONENT = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = f"(?:{_DOMAIN_COMPONENT}(?:\\.{_DOMAIN_COMPONENT})*|\\[[a-fA-F0-9:]+\\])"
_NAME = f"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = "[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = "[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

IMAGE_REFERENCE_PATTERN = f"^({_NAME})(?::{_TAG})?(?:@{_DIGEST})?$"
"""A Docker image reference, anchored; group 1 is the name (repository with its optional registry)."""

IMAGE_REFERENCE_HELP = (
    "an image reference [registry[:port]/]name[:tag][@digest] whose name is lowercase letters, digits and "
    "separators ('.', '_', '__', '-') in '/'-separated parts, e.g. 'corral/workspace:base'"
)
NAME_MAX_LENGTH = 255
"""Docker refuses repository names longer than this (``NameTotalLengthMax``)."""

_REFERENCE = re.compile(IMAGE_REFERENCE_PATTERN)


def check_image_reference(value: str, *, field_name: str = "base_image") -> str:
    """Return ``value`` when Docker would accept it as an image reference.

    Raises:
        InvalidRequestError: naming ``field_name`` and the allowed form.
    """
    match = _REFERENCE.fullmatch(value)
    if match is None:
        raise InvalidRequestError(
            f"{field_name}: {value!r} is not {IMAGE_REFERENCE_HELP}", details={"field": field_name}
        )
    if len(match.group(1)) > NAME_MAX_LENGTH:
        raise InvalidRequestError(
            f"{field_name}: the image name is longer than {NAME_MAX_LENGTH} characters", details={"field": field_name}
        )
    return value
