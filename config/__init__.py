"""The run config as data: one module per component with its config dataclasses, their
constraints and cross-field checks, and the registries that map a choice (`family.name`,
`data.kind`, `backend.name`, `cluster.name`, `eval.jobs`) to its config class.

Behaviour lives with the components (jobs/, orchestrator/), keyed by the same names; this
package imports only common/ and the standard library, so analysis and tools read a run config
without torch. Every config class is frozen: a config does not change after planning."""
from common.settings import ConfigError
from config.run import JobConfig, RunConfig, load_job_config, load_run_config

__all__ = ["ConfigError", "JobConfig", "RunConfig", "load_job_config", "load_run_config"]
