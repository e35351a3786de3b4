"""The test suite: a package, so its helpers import as tests.toy, tests.real and tests.traces."""
