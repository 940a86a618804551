//! The two connections every part of the broker reaches: the executor in use and the engine
//! link. Services, the terminal-output delivery and the change feed each hold these slots;
//! none of them holds another.

use std::sync::RwLock;

use iii_shell_protocol::messages::{Reply, Request};
use iii_shell_protocol::{Code, WireError};

use crate::engine::EngineLink;
use crate::executor_client::{executor_lost, ExecutorClient, OutputStream};

/// The executor connection in use; replaced when a respawned executor comes up.
#[derive(Default)]
pub struct ExecutorSlot {
    client: RwLock<Option<ExecutorClient>>,
}

impl ExecutorSlot {
    pub fn set(&self, c: ExecutorClient) {
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = Some(c);
    }

    pub fn clear(&self) {
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub fn get(&self) -> Option<ExecutorClient> {
        self.client.read().ok().and_then(|g| g.clone())
    }

    pub async fn call(&self, request: Request) -> Result<Reply, WireError> {
        match self.get() {
            Some(c) if !c.is_closed() => c.call(request).await,
            _ => Err(executor_lost()),
        }
    }

    pub async fn call_with_output(
        &self,
        request: Request,
    ) -> Result<(Reply, OutputStream), WireError> {
        match self.get() {
            Some(c) if !c.is_closed() => c.call_with_output(request).await,
            _ => Err(executor_lost()),
        }
    }

    pub async fn call_with_input(
        &self,
        request: Request,
        input: tokio::sync::mpsc::Receiver<Result<Vec<u8>, String>>,
    ) -> Result<Reply, WireError> {
        match self.get() {
            Some(c) if !c.is_closed() => c.call_with_input(request, input).await,
            _ => Err(executor_lost()),
        }
    }
}

/// The engine connection, once serving (absent under `iii-shell call`).
#[derive(Default)]
pub struct EngineSlot {
    link: RwLock<Option<EngineLink>>,
}

impl EngineSlot {
    pub fn set(&self, link: EngineLink) {
        *self.link.write().unwrap_or_else(|p| p.into_inner()) = Some(link);
    }

    /// The engine link, or S216 when running without one (`iii-shell call`).
    pub fn get(&self) -> Result<EngineLink, WireError> {
        self.link
            .read()
            .ok()
            .and_then(|g| g.clone())
            .ok_or_else(|| WireError::new(Code::S216, "this needs an engine connection (data channels and sandbox targets go through the engine); run under `iii-shell serve`"))
    }
}
