//! What a VM's root context and its HTTP contexts share.

use super::ProxyHost;
use crate::vm::Vm;

/// One VM's state and its host port, shared by its root and HTTP contexts (one thread per VM).
pub struct Node {
    pub vm: Vm,
    pub host: ProxyHost,
}
