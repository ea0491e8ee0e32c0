"""MLflow-backed registry of policy versions.

One registered model (`registry.model_name`); each version's artifacts are a model bundle
(see `dagsched.policy.bundle`) and its tags carry the SHA-256 of every bundle file, the
parent version, the data it saw and its evaluation metrics. Loading verifies the checksums
against those tags and runs a smoke inference before anything serves.

The tracking URI is `mlflow_tracking_uri`, by default a SQLite file with an artifact folder
under `home`. Nothing is configured at import: every call passes the URI explicitly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagsched.policy.bundle import FILES, BundleError, load_bundle, save_bundle, verify_checksums
from dagsched.registry.errors import RegistryError
from dagsched.settings import Settings

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from dagsched.policy.scheduler import GNNScheduler

SHIPPED_CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"
CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"
# the learner's latest version while a challenger is under test (`learner.keep_learning`):
# serves the exploration slice, and is the next challenger once the test ends
SHADOW = "shadow"
# the old champion while the guardrail watches the one that replaced it: serves the holdback
# slice (`daemon.holdback_share`), the guardrail's baseline in the same minutes
HOLDBACK = "holdback"
BUNDLE_PATH = "bundle"


@dataclass
class RunLogger:
    """Logs metrics to one MLflow run."""

    client: MlflowClient
    run_id: str

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k.replace("/", "."), float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)


class Registry:
    """Versions, aliases and artifacts of the policy in MLflow."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.home.resolve()
        self.uri = settings.mlflow_tracking_uri or f"sqlite:///{self.home / 'mlflow.db'}"
        self.name = settings.registry.model_name
        self._client: MlflowClient | None = None

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
            os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
            from mlflow.tracking import MlflowClient

            self.home.mkdir(parents=True, exist_ok=True)
            self._client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        return self._client

    def experiment_id(self) -> str:
        name = self.settings.registry.experiment
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        location = (
            None if self.settings.mlflow_tracking_uri else (self.home / "mlartifacts").as_uri()
        )
        return str(self.client.create_experiment(name, artifact_location=location))

    @contextlib.contextmanager
    def run(self, name: str, params: dict[str, Any]) -> Iterator[RunLogger]:
        """An MLflow run that ends FINISHED, or FAILED when the block raises."""
        run = self.client.create_run(self.experiment_id(), run_name=name)
        rid = run.info.run_id
        for k, v in params.items():
            self.client.log_param(rid, k, str(v))
        try:
            yield RunLogger(self.client, rid)
        except BaseException:
            self.client.set_terminated(rid, "FAILED")
            raise
        self.client.set_terminated(rid, "FINISHED")

    # -- versions -----------------------------------------------------------------------------

    def _ensure_model(self) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(self.name)
        except MlflowException:
            self.client.create_registered_model(self.name)

    def register_bundle(
        self,
        folder: Path,
        run_id: str,
        *,
        metrics: dict[str, float],
        parent: str | None,
        data: str,
        tags: dict[str, str] | None = None,
        first_is_champion: bool = True,
    ) -> str:
        """Upload `folder` as the run's artifacts and create a version; the first version of
        the model becomes `champion`. Returns the version number as a string."""
        sums = verify_checksums(folder)
        self.client.log_artifacts(run_id, str(folder), artifact_path=BUNDLE_PATH)
        self._ensure_model()
        all_tags = {f"sha256.{name}": sums[name] for name in FILES}
        all_tags.update({"parent": parent or "", "data": data})
        all_tags.update({f"metric.{k}": f"{v:.6g}" for k, v in metrics.items()})
        all_tags.update(tags or {})
        source = f"{self.client.get_run(run_id).info.artifact_uri}/{BUNDLE_PATH}"
        mv = self.client.create_model_version(self.name, source, run_id=run_id, tags=all_tags)
        version = str(mv.version)
        if first_is_champion and self.alias_version(CHAMPION) is None:
            self.client.set_registered_model_alias(self.name, CHAMPION, version)
        return version

    def alias_version(self, alias: str) -> str | None:
        """The version `alias` points at, or None (also when nothing is registered yet)."""
        from mlflow.exceptions import MlflowException

        try:
            return str(self.client.get_model_version_by_alias(self.name, alias).version)
        except MlflowException:
            return None

    def set_alias(self, alias: str, version: str) -> None:
        self.client.set_registered_model_alias(self.name, alias, version)

    def delete_alias(self, alias: str) -> None:
        """Take `alias` off whatever version carries it (a no-op when none does)."""
        from mlflow.exceptions import MlflowException

        with contextlib.suppress(MlflowException):
            self.client.delete_registered_model_alias(self.name, alias)

    def parent_of(self, version: str) -> str | None:
        """The `parent` tag of `version` (the champion it was fine-tuned from), or None."""
        parent = self.client.get_model_version(self.name, version).tags.get("parent")
        return parent or None

    def versions(self) -> list[Any]:
        """Every version, newest first."""
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.search_model_versions(f"name='{self.name}'")
        except MlflowException:
            return []
        return sorted(found, key=lambda v: int(v.version), reverse=True)

    def aliases(self) -> dict[str, str]:
        """alias -> version."""
        from mlflow.exceptions import MlflowException

        try:
            model = self.client.get_registered_model(self.name)
        except MlflowException:
            return {}
        return {a: str(v) for a, v in (model.aliases or {}).items()}

    def bundle_folder(self, version: str) -> Path:
        """Download (once) the version's bundle into the local cache and return the folder."""
        dest = self.home / "cache" / "versions" / version
        if not dest.is_dir():
            mv = self.client.get_model_version(self.name, version)
            tmp = dest.with_name(dest.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            self.client.download_artifacts(str(mv.run_id), BUNDLE_PATH, str(tmp))
            (tmp / BUNDLE_PATH).rename(dest)
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def load(self, version: str) -> GNNScheduler:
        """A verified serving scheduler for `version`; RegistryError if it is refused."""
        from mlflow.exceptions import MlflowException

        try:
            mv = self.client.get_model_version(self.name, version)
            expected = {n: mv.tags.get(f"sha256.{n}", "") for n in FILES}
            folder = self.bundle_folder(version)
        except (MlflowException, OSError) as exc:
            raise RegistryError(f"version {version}: cannot fetch: {exc}") from None
        try:
            return load_bundle(folder, f"v{version}", expected)
        except BundleError as exc:
            raise RegistryError(f"version {version} refused: {exc}") from None

    def ensure_champion(self, shipped: Path = SHIPPED_CHAMPION) -> str | None:
        """When nothing is registered, register the shipped bundle as `champion`."""
        if self.versions() or not (shipped / "checksums.json").is_file():
            return self.alias_version(CHAMPION)
        with self.run("shipped-champion", {"source": str(shipped)}) as run:
            version = self.register_bundle(
                shipped,
                run.run_id,
                metrics={},
                parent=None,
                data="shipped with the repository",
                tags={"origin": "shipped"},
            )
        return version


__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "HOLDBACK",
    "PREVIOUS",
    "SHADOW",
    "Registry",
    "RegistryError",
    "save_bundle",
]
