"""`make deploy-check`: the image, the compose stack and its faults on a real Docker engine.

Not part of `make test`: it needs root, a Docker engine and a few minutes. `python -m
tests.deploy.check` runs it; see deploy/README.md for what it does and what it printed.
"""
