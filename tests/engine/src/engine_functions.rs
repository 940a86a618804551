//! The functions the engine itself serves (in namespace `default`), by id. A leaf: routing
//! resolves ids to them, and [`crate::builtins`] runs them.

/// Functions the engine serves in-process, all in namespace `default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    WorkersRegister,
    ChannelsCreate,
    ConfigRegister,
    ConfigGet,
    ConfigSet,
    ConfigList,
    ConfigSchema,
    TracesList,
    TracesTree,
    LogsList,
    WorkersInfo,
}

impl Builtin {
    pub(crate) fn from_id(id: &str) -> Option<Self> {
        Some(match id {
            "engine::workers::register" => Builtin::WorkersRegister,
            "engine::channels::create" => Builtin::ChannelsCreate,
            "configuration::register" => Builtin::ConfigRegister,
            "configuration::get" => Builtin::ConfigGet,
            "configuration::set" => Builtin::ConfigSet,
            "configuration::list" => Builtin::ConfigList,
            "configuration::schema" => Builtin::ConfigSchema,
            "engine::traces::list" => Builtin::TracesList,
            "engine::traces::tree" => Builtin::TracesTree,
            "engine::logs::list" => Builtin::LogsList,
            "engine::workers::info" => Builtin::WorkersInfo,
            _ => return None,
        })
    }
}
