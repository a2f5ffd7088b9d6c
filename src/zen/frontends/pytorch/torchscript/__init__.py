"""TorchScript modules (script, trace, jit.load): their C++ layout measured (`calibration`), their C++ trees read
(`reader`), and joined to recovery (`models`)."""
