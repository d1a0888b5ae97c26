"""Environment authoring kit: `gymflow env new` (a plug-in skeleton) and `gymflow env check` (a dataset
played through an environment's real tool and verify code, by line)."""
