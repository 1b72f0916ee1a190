"""The browser fixtures (tests/dashboard/browser.py) for every test module of this folder."""

from tests.dashboard.browser import chromium, page

__all__ = ["chromium", "page"]
