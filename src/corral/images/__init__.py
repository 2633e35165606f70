"""Workspace images: building the ``corral/workspace:base`` image from Debian packages, and checking image
references before they are used."""
