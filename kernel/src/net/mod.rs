//! The network side of the appliance: the virtio-net NIC, an IPv4/TCP stack (smoltcp)
//! configured statically or by DHCP, and the 9P2000.L service on TCP.
//!
//! | module | what |
//! |---|---|
//! | [`nic`] | virtio-net (modern PCI) as a smoltcp device; MSI-X wake-ups, polling fallback |
//! | [`offload`] | checksum and segmentation offload: what smoltcp leaves to the device, and the work on each frame around it |
//! | [`stack`] | interface, sockets, DHCP, and the task that polls them |
//! | [`sockets`] | the socket table: a set per socket, frames routed by 4-tuple, only due sockets polled |
//! | [`tcp`] | a smoltcp TCP socket as a 9P `Transport` |
//! | [`listener`] | the 9P listener (a pool of listening sockets) handing connections to CPUs; the serving policy is `ninep::service` |
//! | [`limits`] | connection limit and socket buffer sizing |
//! | [`stats`] | per-cause counters |
//! | [`stats_port`] | the read-only counters service (`stats=PORT`) |
//!
//! The service is generic over the filesystem ([`vfs::FileSystem`]): [`serve`] takes
//! whatever the boot sequence mounted.

pub mod limits;
#[cfg(test)]
mod loss_recovery;

#[cfg(target_os = "none")]
pub mod listener;
#[cfg(target_os = "none")]
pub mod nic;
pub mod offload;
pub mod sockets;
#[cfg(target_os = "none")]
pub mod stack;
pub mod stats;
#[cfg(target_os = "none")]
pub mod stats_port;
pub mod syn_gate;
#[cfg(target_os = "none")]
pub mod tcp;
#[cfg(test)]
mod test_frames;

#[cfg(target_os = "none")]
pub use serve_impl::{serve, NetError};

#[cfg(target_os = "none")]
mod serve_impl {
    use alloc::rc::Rc;
    use alloc::sync::Arc;
    use alloc::vec::Vec;
    use core::fmt;

    use ninep::admin::AdminFs;
    use ninep::server::export::apply_quotas;
    use ninep::server::{Config as NinepConfig, Export, Server, TenantLimits, Timeouts};
    use vfs::FileSystem;

    use super::limits::{client_memory, max_sockets, socket_buffer};
    use super::listener::Listener;
    use super::nic::{Nic, NicError};
    use super::stack::Stack;
    use crate::config::Config;
    use crate::event::{self, Event};
    use crate::task;

    const NS_PER_SEC: u64 = 1_000_000_000;

    /// Why the network could not start.
    #[derive(Debug)]
    pub enum NetError {
        /// No virtio-net device (1af4:1041 or transitional 1af4:1000; QEMU: `-device virtio-net-pci`).
        NoNic,
        /// The NIC could not be brought up.
        Nic(NicError),
    }

    impl fmt::Display for NetError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                NetError::NoNic => f.write_str(
                    "no virtio-net device (1af4:1041 or 1af4:1000; QEMU: -device virtio-net-pci)",
                ),
                NetError::Nic(e) => write!(f, "{e}"),
            }
        }
    }

    /// Brings up the NIC and the stack, and serves `fs` over 9P on `config.port` with the
    /// exports, allow-lists and groups of `config.access`: spawns
    /// the stack's poll task, the listener and the statistics reporter, and returns the
    /// service once the interface has an address.
    pub async fn serve<F: FileSystem + vfs::Control + Send + Sync + 'static>(
        config: &Config,
        fs: F,
        heap_bytes: u64,
    ) -> Result<Rc<Listener<AdminFs<F>>>, NetError> {
        let dev = Nic::find().ok_or(NetError::NoNic)?;
        let nic = Nic::new(dev, config.mtu, config.offload).map_err(NetError::Nic)?;
        let (stack, poller) = Stack::new(nic, config.ip, config.gateway);
        task::spawn(poller.run());
        let address = stack.wait_configured().await;
        let limits = &config.ninep;
        let base = NinepConfig {
            max_msize: limits.msize,
            max_fids: limits.max_fids,
            max_in_flight: limits.max_in_flight,
            max_conns_per_client: limits.max_conns_per_client,
            clock: Some(|| crate::clock::now().as_nanos()),
            timeouts: Timeouts {
                handshake_ns: u64::from(limits.handshake_secs) * NS_PER_SEC,
                idle_ns: u64::from(limits.idle_secs) * NS_PER_SEC,
                ..Timeouts::default()
            },
            ..NinepConfig::default()
        };
        let mut config9p = config.access.server_config(Export::root(""), base);
        let mut exports = Vec::new();
        for e in &config9p.exports {
            log::info!("9p: export {e} (clients: {})", config9p.allow_list(e));
            exports.push(event::Export {
                export: event::Text::display(e),
                clients: event::Text::display(config9p.allow_list(e)),
            });
        }
        let client_mem = match limits.client_mem_mib {
            Some(mib) => (mib as usize) << 20,
            None => client_memory(heap_bytes),
        };
        config9p.memory = config9p.memory_for(client_mem);
        if let Some(mib) = limits.client_mem_per_tenant_mib {
            config9p.memory.per_tenant = (mib as usize) << 20;
        }
        let tenant = &mut config9p.tenant;
        *tenant =
            TenantLimits::for_server(limits.max_fids, limits.max_in_flight, config9p.max_locks);
        tenant.max_fids = limits.max_fids_per_tenant.unwrap_or(tenant.max_fids);
        tenant.max_locks = limits.max_locks_per_tenant.unwrap_or(tenant.max_locks);
        tenant.max_in_flight = limits
            .max_in_flight_per_tenant
            .unwrap_or(tenant.max_in_flight);
        let memory = config9p.memory;
        match apply_quotas(&fs, &mut config9p.exports).await {
            Ok(applied) => {
                for (export, q) in applied {
                    log::info!(
                        "9p: export {export:?}: quota {:?} bytes, {:?} inodes; holds {} bytes, {} inodes",
                        q.limits.bytes,
                        q.limits.inodes,
                        q.bytes,
                        q.inodes
                    );
                }
            }
            // Served anyway, without that export's limits: the log says which.
            Err((export, e)) => log::error!("9p: export {export:?}: quota not applied: {e}"),
        }
        // The administration tree is reachable only through its export (`admin_allow=`).
        let server = Arc::new(Server::new(AdminFs::new(fs), config9p));
        let buffer = socket_buffer(heap_bytes, max_sockets(limits.max_conns));
        let listener = Listener::new(
            stack,
            server,
            config.port,
            buffer,
            limits.max_conns,
            limits.max_conns_per_tenant.unwrap_or(limits.max_conns),
            config.serve_cpus,
        );
        task::spawn(listener.clone().run());
        task::spawn(listener.clone().report());
        task::spawn(listener.clone().housekeeping());
        log::info!(
            "9p: listening on {}:{} (up to {} connections, {} KiB socket buffers each way, msize up to {} KiB)",
            address.address(),
            config.port,
            limits.max_conns,
            buffer >> 10,
            limits.msize >> 10
        );
        event::emit(Event::Listening {
            service: "9p",
            address: Some(event::Text::display(address.address())),
            port: config.port,
            max_conns: Some(limits.max_conns),
            exports: event::list(exports),
            clients: None,
        });
        log::debug!(
            "9p: client memory {} MiB ({} MiB per connection in requests, {} MiB in held state, {} KiB reserved each)",
            memory.limit >> 20,
            memory.per_connection >> 20,
            memory.held_per_connection >> 20,
            memory.reserve >> 10
        );
        Ok(listener)
    }
}
