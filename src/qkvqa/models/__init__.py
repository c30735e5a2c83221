"""LightningModules that orchestrate the stages and hold no model math: `qff_module.QFFTrainer` trains the QFF."""
