"""Automatic mixed precision: torchext's GradScaler (filled in by the scaler issue)."""
