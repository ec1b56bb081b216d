"""The DistributedTrainingJob API: models, names, CRD generation."""
