"""The Keras 3 / TensorFlow front end: Keras models (layers, configuration, functional graph) and every variable.

`calibration.py` + `profile.py` measure and load TF's tensor layout (`zen profile tf`), `layout.py` decodes it,
`tensors.py` reads tensors and variables from an image, `layers.py` finds layers and models by MRO, `mr.py` builds
the MR, `stage.py` is the recovery stage `zen recover` runs when an image holds a Keras model. Nothing here imports
TensorFlow except the calibrator, which runs in the target's interpreter, never zen's.
"""
