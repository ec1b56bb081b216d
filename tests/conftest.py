"""Shared by unit and integration tests: pytest puts this folder on sys.path, so modules here
(jobs: the job builder; reports: the launcher's report; kubeflow_examples) can be imported by
tests in either suite."""
