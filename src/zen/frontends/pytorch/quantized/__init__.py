"""Packed quantized weights (fbgemm's PackedLinearWeight): their layout measured (`calibration`), read (`packed`)."""
