"""Deployment files and the local stack of many hosts (issue #19): ``prefect.yaml``,
``register.sh``, the Kubernetes GPU job template, and ``stack.py``, run from the repository's
root as ``python -m deployments.stack up|env|down``. Not installed; nothing imports it but
its own modules."""
