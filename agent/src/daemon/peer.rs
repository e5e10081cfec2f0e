//! Who is calling, over mutual TLS: the certificate rules of `lockstep_core::tls::PeerCert`
//! applied to a call. The token check (the interceptor) comes first and stays as it is; these
//! rules come on top and only with TLS (without it there is no certificate to go by).

use lockstep_core::tls::{PeerCert, PeerError};
use tonic::{Request, Status};

/// The caller's certificate when this agent serves over TLS; None without TLS.
pub(super) fn peer_cert<T>(tls: bool, req: &Request<T>) -> Result<Option<PeerCert>, PeerError> {
    if !tls {
        return Ok(None);
    }
    let certs = req.peer_certs().ok_or(PeerError::Missing)?;
    let leaf = certs.first().ok_or(PeerError::Missing)?;
    PeerCert::parse(leaf).map(Some)
}

fn refused(agent: &str, e: PeerError) -> Status {
    Status::permission_denied(format!("agent '{agent}' refuses the call: {e}"))
}

/// Every call but `Mirror` is a coordinator's: over TLS an agent's certificate (or any that may
/// serve) is refused, so one agent cannot prepare, start or abort runs on another.
pub(super) fn from_coordinator<T>(agent: &str, tls: bool, req: &Request<T>) -> Result<(), Status> {
    match peer_cert(tls, req) {
        Ok(Some(p)) => p.check_coordinator().map_err(|e| refused(agent, e)),
        Ok(None) => Ok(()),
        Err(e) => Err(refused(agent, e)),
    }
}

/// A `Mirror` call: over TLS only an agent's certificate opens the stream (a coordinator's is
/// refused at once); which agent it must be is known from the first write (`check_primary`).
pub(super) fn mirror_caller<T>(
    agent: &str,
    tls: bool,
    req: &Request<T>,
) -> Result<Option<PeerCert>, Status> {
    let peer = peer_cert(tls, req).map_err(|e| refused(agent, e))?;
    if let Some(p) = &peer {
        p.check_agent().map_err(|e| refused(agent, e))?;
    }
    Ok(peer)
}

/// Each mirrored write names its primary, `agent/volume`: the caller's certificate must be
/// issued for that agent (agent names in a TLS deployment are DNS names, without '/').
pub(super) fn check_primary(agent: &str, peer: &PeerCert, primary: &str) -> Option<Status> {
    let primary_agent = primary.split_once('/').map_or(primary, |(a, _)| a);
    peer.check_primary(primary_agent)
        .err()
        .map(|e| refused(agent, e))
}
