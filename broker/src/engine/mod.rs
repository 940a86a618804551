//! The engine link: the iii engine's WebSocket protocol, spoken directly.
//!
//! * [`endpoint`]: which engine to talk to, and the start-up reachability probe.
//! * [`frames`]: the JSON frames of the worker protocol.
//! * [`link`]: one logical connection that survives engine restarts and network drops:
//!   keepalive, reconnect, reattach, replay, calls out and invocations in.

pub mod channel;
pub mod endpoint;
pub mod frames;
pub mod link;

pub use link::{
    EngineLink, Invoker, LinkOptions, OfferedBinding, PreparedCall, SentCall, TriggerProvider,
};
