//! The data plane: capture, proxy port, mesh hop, UDP (ARCHITECTURE.md "proxy").

pub mod socket;
