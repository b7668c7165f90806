//! `tenants`: fair share is per tenant, not per lane. Tenant A streams bulk writes over a
//! connection with many lanes (16 by default), tenant B over one with a single lane, at the same
//! time through one runtime; B/A should be about 1.
use std::time::{Duration, Instant};

use crate::cli::Mixed;
use crate::conn::{build_rt_with, control_plane, BoxErr, CpuMeter, ServerChild};
use crate::mixed::{sched_config, serve, server_args, stream};
use crate::report::{print, Val};

pub fn run(m: &Mixed) -> Result<(), BoxErr> {
    let a = &m.common;
    if a.server {
        return serve(m, 2);
    }
    let lanes_a = m.lanes.unwrap_or(16);
    let (child, addr) = match &a.connect {
        Some(addr) => (None, addr.clone()),
        None => {
            let (c, addr) = ServerChild::spawn_with("tenants", a, &server_args(m))?;
            (Some(c), addr)
        }
    };
    let tokio = control_plane()?;
    let rt = build_rt_with(a, sched_config(m), 1, 1)?;
    let (ep_a, ep_b) = tokio.block_on(async {
        let x = rt.connect_with_lanes(addr.clone(), lanes_a).await?;
        let y = rt.connect_with_lanes(addr.clone(), 1).await?;
        Ok::<_, BoxErr>((x, y))
    })?;
    let cpu = CpuMeter::start();
    let (ga, gb) = rt.block_on(async {
        let ra = ep_a.recv_descriptor().await?;
        let rb = ep_b.recv_descriptor().await?;
        let never = std::sync::atomic::AtomicBool::new(false);
        let until = Some(Instant::now() + Duration::from_secs_f64(m.secs));
        let (x, y) = futures::join!(
            stream(&rt, &ep_a, &ra, m, 1, &never, until),
            stream(&rt, &ep_b, &rb, m, 2, &never, until)
        );
        for ep in [&ep_a, &ep_b] {
            ep.send(rt.alloc(1)?).await.0?;
        }
        Ok::<_, BoxErr>((x?, y?))
    })?;
    let cpu_pct = cpu.pct();
    drop((ep_a, ep_b));
    let server_cpu = match child {
        Some(c) => c.finish()?,
        None => f64::NAN,
    };
    let gbps = |bps: f64| bps * 8.0 / 1e9;
    print(
        a.json,
        &format!(
            "tenants: A on {lanes_a} lanes, B on 1, bulk {} B x {} each, over {}",
            m.bulk_size,
            m.bulk_window,
            rt.provider()
        ),
        &[
            ("bench", Val::S("tenants".into())),
            ("provider", Val::S(rt.provider().into())),
            ("lanes_a", Val::I(lanes_a as u64)),
            ("a_gbps", Val::F(gbps(ga.bps))),
            ("b_gbps", Val::F(gbps(gb.bps))),
            ("b_over_a", Val::F(gb.bps / ga.bps)),
            ("a_p50_us", Val::F(ga.us(0.5))),
            ("a_p99_us", Val::F(ga.us(0.99))),
            ("a_p999_us", Val::F(ga.us(0.999))),
            ("b_p50_us", Val::F(gb.us(0.5))),
            ("b_p99_us", Val::F(gb.us(0.99))),
            ("b_p999_us", Val::F(gb.us(0.999))),
            ("driver", Val::S(format!("{:?}", a.driver).to_lowercase())),
            ("cpu_pct", Val::F(cpu_pct)),
            ("server_cpu_pct", Val::F(server_cpu)),
        ],
    );
    Ok(())
}
