//! A fake Kubernetes API server over real HTTP on loopback.
