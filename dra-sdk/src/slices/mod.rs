//! ResourceSlice publishing: the device model, validation, splitting and the reconcile loop.
