//! Data-parallel training on the host backend: each rank (a thread here, a process or GPU
//! in real life) fits the same linear model `y = w . x + b` to its own shard of the data,
//! and after every step the ranks average their gradients with one all-reduce, so their
//! weights stay identical. The loss falls; every rank ends with the same weights.
//!
//! Run: `cargo run --release --example training_loop [nranks]` (default 2).

use rustccl::typed::prelude::*;

const FEATURES: usize = 8;
const SAMPLES_PER_RANK: usize = 256;
const STEPS: usize = 200;
const LEARNING_RATE: f32 = 0.05;

/// A tiny deterministic generator (no dependency needed for an example).
fn lcg(state: &mut u64) -> f32 {
    *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// This rank's shard: features and targets of a known model plus noise.
fn shard(rank: u32) -> (Vec<[f32; FEATURES]>, Vec<f32>) {
    let true_w: Vec<f32> = (0..FEATURES).map(|i| (i as f32 - 3.5) / 4.0).collect();
    let mut s = 12345 + rank as u64 * 7919;
    let xs: Vec<[f32; FEATURES]> = (0..SAMPLES_PER_RANK).map(|_| std::array::from_fn(|_| lcg(&mut s))).collect();
    let ys = xs.iter().map(|x| x.iter().zip(&true_w).map(|(a, b)| a * b).sum::<f32>() + 0.5 + 0.01 * lcg(&mut s)).collect();
    (xs, ys)
}

/// Trains on one rank; the final loss and parameters.
fn train(comm: Comm) -> Result<(f32, f32, Vec<f32>), rustccl::typed::Error> {
    let (xs, ys) = shard(comm.rank().get());
    let mut params = vec![0.0f32; FEATURES + 1]; // weights, then the bias
    let mut grads = vec![0.0f32; FEATURES + 1];
    let stream = comm.stream()?;
    let mut first_loss = None;
    let mut loss = [0.0f32];
    for _ in 0..STEPS {
        grads.iter_mut().for_each(|g| *g = 0.0);
        loss[0] = 0.0;
        for (x, y) in xs.iter().zip(&ys) {
            let pred: f32 = x.iter().zip(&params).map(|(a, w)| a * w).sum::<f32>() + params[FEATURES];
            let err = pred - y;
            loss[0] += err * err / SAMPLES_PER_RANK as f32;
            for (g, a) in grads.iter_mut().zip(x) {
                *g += 2.0 * err * a / SAMPLES_PER_RANK as f32;
            }
            grads[FEATURES] += 2.0 * err / SAMPLES_PER_RANK as f32;
        }
        // The gradient (and, for the log, the loss) averaged over every rank's shard.
        comm.group(|g| {
            g.all_reduce_in_place(&mut grads, Op::Avg, &stream)?;
            g.all_reduce_in_place(&mut loss, Op::Avg, &stream)
        })?;
        first_loss.get_or_insert(loss[0]);
        for (p, g) in params.iter_mut().zip(&grads) {
            *p -= LEARNING_RATE * g;
        }
    }
    Ok((first_loss.unwrap_or(0.0), loss[0], params))
}

fn main() -> Result<(), rustccl::typed::Error> {
    std::env::set_var("RUSTCCL_BACKEND", std::env::var("RUSTCCL_BACKEND").unwrap_or_else(|_| "host".into()));
    let n: i32 = std::env::args().nth(1).map(|a| a.parse().expect("nranks")).unwrap_or(2);
    let comms = Comm::init_all(&(0..n).collect::<Vec<_>>())?;
    // A Comm is Send (not Sync): each thread owns its rank's.
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = comms.into_iter().map(|c| s.spawn(move || train(c))).collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    })?;
    let (first, last, params) = &results[0];
    println!("{n} ranks, {STEPS} steps: loss {first:.4} -> {last:.4}");
    println!("weights {:?}", &params[..FEATURES]);
    println!("bias {:.3}", params[FEATURES]);
    assert!(last < &(first / 10.0), "the loss did not fall");
    assert!(results.iter().all(|(_, _, p)| p == params), "ranks ended with different weights");
    Ok(())
}
