//! Who sent a request, as the routes that act on it need to know: the key's grant (when
//! keys are configured) and whether the client is on this machine. What a caller may
//! route with: the models its key allows, and the instances it may choose.

use std::net::SocketAddr;
use std::sync::Arc;

use switchyard_config::auth::{Grant, InstanceChoice};

/// The caller of one request (a request extension set by `guards::authorize`).
#[derive(Clone, Debug)]
pub struct Caller {
    /// The verified key's grant; None when no keys are configured (or the route is open).
    pub grant: Option<Arc<Grant>>,
    /// Whether the client connected from a loopback address (IPv4, IPv6, or IPv4-mapped).
    pub loopback: bool,
    /// Who may choose an instance (`auth.choose_instance` of the generation that checked
    /// the key).
    pub choice: InstanceChoice,
}

/// Whether `peer` is on this machine, whatever form the address takes.
pub fn is_loopback(peer: &SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

/// Why a caller may not route as it asked.
#[derive(Debug)]
pub enum Forbidden {
    Model(String),
    Instance(String),
}

impl std::fmt::Display for Forbidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Forbidden::Model(m) => write!(f, "this API key may not use model `{m}` (its grant's `models` does not list it)"),
            Forbidden::Instance(i) => write!(f, "this client may not choose the instance (`{i}`): list it in the key's `instances`, or set `auth.choose_instance`"),
        }
    }
}

impl Caller {
    /// A caller the router cannot see behind (a gateway's clients, over ext_proc): never
    /// loopback, whatever the gateway's address.
    pub fn behind_gateway(grant: Option<Arc<Grant>>, choice: InstanceChoice) -> Self {
        Caller {
            grant,
            loopback: false,
            choice,
        }
    }

    /// A request for `model`, routed with `instance` when it names one.
    pub fn check_route(&self, model: &str, instance: Option<&str>) -> Result<(), Forbidden> {
        self.check_model(model)?;
        instance.map_or(Ok(()), |i| self.check_instance(i))
    }

    pub fn check_model(&self, model: &str) -> Result<(), Forbidden> {
        match &self.grant {
            Some(grant) if !grant.allows_model(model) => Err(Forbidden::Model(model.to_owned())),
            _ => Ok(()),
        }
    }

    /// Whether this caller may route with `instance` rather than the default.
    pub fn check_instance(&self, instance: &str) -> Result<(), Forbidden> {
        let scoped = self
            .grant
            .as_ref()
            .is_some_and(|g| g.instances.contains(instance));
        let allowed = scoped
            || match self.choice {
                InstanceChoice::Anyone => true,
                InstanceChoice::Loopback => self.loopback,
                InstanceChoice::Scoped => false,
            };
        if allowed {
            Ok(())
        } else {
            Err(Forbidden::Instance(instance.to_owned()))
        }
    }
}
