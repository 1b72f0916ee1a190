"""The test suite (a regular package: a dependency that installs a top-level ``tests`` package,
as gmqtt's wheel does, must not shadow this one)."""
