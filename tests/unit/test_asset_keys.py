"""Asset keys of the lineage (issue #41): where the tables and model versions live."""

from __future__ import annotations

import logging

from prefect_conductor.tasks.assets import model_asset, record_model_version, table_asset


def test_table_and_model_keys_name_where_they_live(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CONDUCTOR_ARTIFACTS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert table_asset("runs", str(tmp_path / "store")) == (tmp_path / "store").as_uri() + "/runs"
    assert table_asset("pairs", "s3://bucket/prefix") == "s3://bucket/prefix/pairs"
    assert model_asset("conductor", "3").endswith("/models/conductor/3")
    assert model_asset("conductor", "3").startswith("sqlite:///")


def test_a_lineage_that_cannot_be_recorded_is_a_warning_not_a_lost_model(caplog):
    def upstream():
        raise RuntimeError("tracking server gone")

    with caplog.at_level(logging.WARNING):
        assert record_model_version("conductor", "7", upstream, {}) is None
    assert "lineage of conductor version 7 not recorded: tracking server gone" in caplog.text
