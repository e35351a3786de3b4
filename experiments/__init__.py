"""The studies behind docs/results.md: eval sweeps, weight searches, gate selection and the report, built on adafuse."""
