//! Eviction and thinning orders across page geometries and row layouts:
//! snapshot pressure thins interior checkpoints by shortest interval, then
//! least recent access, before evicting leaves; page pressure evicts least
//! recently used eligible leaves; pins, GPU uses and branches retain.

mod prefix_support;

use helios::prefix::{CheckpointId, PrefixChain};
use prefix_support::{tokens, Capture, Harness, Recipe, GEOMETRIES, SALT};

fn each_geometry(test: impl Fn(Recipe, u32)) {
    for recipe in Recipe::ALL {
        for page_tokens in GEOMETRIES {
            test(recipe, page_tokens);
        }
    }
}

/// Publishes one checkpoint per endpoint along `stream`, then ends the
/// request: the chain is cached and unpinned.
fn publish_chain(h: &mut Harness, stream: &[u32], endpoints: &[u32]) -> Vec<CheckpointId> {
    let last = *endpoints.last().unwrap();
    let mut r = h.admit(stream, last).unwrap();
    let ids = (endpoints.iter())
        .map(|&t| match h.capture_at(&mut r, t) {
            Capture::New(id) => id,
            other => panic!("capture at {t}: {other:?}"),
        })
        .collect();
    h.finish(r);
    ids
}

fn hit_tokens(h: &Harness, stream: &[u32], limit: u32) -> Option<u32> {
    let chain = PrefixChain::new(SALT, &stream[..limit as usize]);
    h.store.lookup(&chain, limit).map(|hit| hit.tokens())
}

#[test]
fn snapshot_pressure_thins_interior_checkpoints_by_shortest_interval_then_evicts() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 64);
        let stream = tokens(800, 1);
        let [c100, c130, c400, c700] = publish_chain(&mut h, &stream, &[100, 130, 400, 700])[..]
        else {
            unreachable!()
        };
        let mut reservations = Vec::new();
        let mut reserve = |h: &mut Harness| {
            let grant = h.store.reserve_snapshot().unwrap();
            let eviction = grant.eviction.clone();
            h.apply(grant.eviction);
            reservations.push(grant.reservation);
            h.check(&[]);
            eviction
        };
        // Interior 130 delimits 100..400 (300 tokens), interior 400
        // delimits 130..700; the root 100 (0..130) comes after interiors.
        assert_eq!(reserve(&mut h).thinned, vec![c130]);
        assert_eq!(h.store.checkpoint(c400).unwrap().parent, Some(c100));
        assert_eq!(hit_tokens(&h, &stream, 399), Some(100));
        assert_eq!(reserve(&mut h).thinned, vec![c400]);
        assert_eq!(reserve(&mut h).thinned, vec![c100]);
        // The survivor holds every complete page of its chain.
        let survivor = h.store.checkpoint(c700).unwrap();
        assert_eq!(survivor.parent, None);
        assert_eq!(survivor.segment.len() as u32, 700 / page_tokens);
        // Nothing left to thin: the least recently used leaf goes, pages too.
        let eviction = reserve(&mut h);
        assert_eq!(eviction.evicted, vec![c700]);
        assert_eq!(eviction.pages.len() as u32, 700 / page_tokens);
        let refused = h.store.reserve_snapshot().unwrap_err();
        assert_eq!((refused.rows, refused.reserved), (4, 4));
        let metrics = h.store.metrics();
        assert_eq!((metrics.thinned, metrics.evicted), (3, 1));
        assert_eq!(metrics.snapshot_pressure, 5);
        assert_eq!(metrics.snapshot_refusals, 1);
        for reservation in reservations {
            h.store.release_reservation(reservation);
        }
        h.drain(Vec::new());
    });
}

#[test]
fn equal_intervals_thin_the_least_recently_accessed_first() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 6, 64);
        let x = tokens(400, 2);
        let y = tokens(400, 3);
        let [_, x200, _] = publish_chain(&mut h, &x, &[100, 200, 300])[..] else {
            unreachable!()
        };
        let [_, y200, _] = publish_chain(&mut h, &y, &[100, 200, 300])[..] else {
            unreachable!()
        };
        // A hit on x's 200 makes y's 200 the least recently accessed.
        let chain = PrefixChain::new(SALT, &x[..250]);
        let (pin, hit) = h.store.acquire(&chain, 250).unwrap();
        assert_eq!(hit.checkpoint, x200);
        h.store.unpin(pin);
        let first = h.store.reserve_snapshot().unwrap();
        assert_eq!(first.eviction.thinned, vec![y200]);
        let second = h.store.reserve_snapshot().unwrap();
        assert_eq!(second.eviction.thinned, vec![x200]);
        h.store.release_reservation(first.reservation);
        h.store.release_reservation(second.reservation);
        h.apply(first.eviction);
        h.apply(second.eviction);
        h.check(&[]);
        h.drain(Vec::new());
    });
}

#[test]
fn page_pressure_evicts_lru_leaves_and_spares_pins_and_gpu_uses() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 8, 64);
        let t = 3 * page_tokens + 5;
        let streams: Vec<Vec<u32>> = (0..4).map(|i| tokens(t as usize + 10, 10 + i)).collect();
        let leaves: Vec<CheckpointId> = (streams.iter())
            .map(|s| publish_chain(&mut h, s, &[t])[0])
            .collect();
        // Leaf 0 stays pinned; leaf 1's pin ends while a GPU use of it is
        // still outstanding (launches in flight).
        let pinned = h.store.pin(leaves[0]).unwrap();
        let in_use = h.store.pin(leaves[1]).unwrap();
        let gpu_use = h.store.begin_use(&in_use);
        h.store.unpin(in_use);
        let pressure = h.store.pressure();
        assert_eq!(pressure.pages.held, 12);
        assert_eq!(pressure.pages.reclaimable, 6);
        assert_eq!((pressure.rows.held, pressure.rows.reclaimable), (4, 2));
        let eviction = h.store.reclaim_pages(100);
        assert_eq!(eviction.evicted, vec![leaves[2], leaves[3]]);
        assert_eq!(eviction.pages.len(), 6);
        assert!(eviction.thinned.is_empty());
        h.apply(eviction);
        assert_eq!(h.store.metrics().page_shortfalls, 1);
        assert_eq!(h.store.pressure().pages.reclaimable, 0);
        h.store.end_use(gpu_use);
        let eviction = h.store.reclaim_pages(1);
        assert_eq!(eviction.evicted, vec![leaves[1]]);
        h.apply(eviction);
        h.store.unpin(pinned);
        let eviction = h.store.reclaim_pages(1);
        assert_eq!(eviction.evicted, vec![leaves[0]]);
        h.apply(eviction);
        assert_eq!(h.store.metrics().evicted_pages, 12);
        h.drain(Vec::new());
    });
}

#[test]
fn page_pressure_peels_leaves_before_their_ancestors_and_moves_no_pages() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 64);
        let a_end = 3 * page_tokens + 5;
        let b_end = 5 * page_tokens + 7;
        let stream = tokens(b_end as usize + 10, 20);
        let [a, b] = publish_chain(&mut h, &stream, &[a_end, b_end])[..] else {
            unreachable!()
        };
        // A request on b holds the whole chain: nothing is reclaimable.
        let mut r = h.admit(&stream, b_end + 5).unwrap();
        assert_eq!(r.reused, b_end);
        let eviction = h.store.reclaim_pages(1);
        assert!(eviction.evicted.is_empty() && eviction.pages.is_empty());
        h.consume(&mut r, b_end + 5).unwrap();
        h.finish(r);
        // The leaf goes first with its own segment; the ancestor keeps its
        // pages and snapshot until it is a leaf itself.
        let eviction = h.store.reclaim_pages(1);
        assert_eq!(eviction.evicted, vec![b]);
        assert_eq!(eviction.pages.len(), 2);
        h.apply(eviction);
        assert_eq!(h.store.checkpoint(a).unwrap().children, Vec::new());
        h.check(&[]);
        let eviction = h.store.reclaim_pages(1);
        assert_eq!((&eviction.evicted, eviction.pages.len()), (&vec![a], 3));
        h.apply(eviction);
        assert_eq!(h.store.metrics().thinned, 0);
        h.drain(Vec::new());
    });
}

#[test]
fn checkpoints_in_gpu_use_are_neither_thinned_nor_evicted() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 3, 64);
        let stream = tokens(700, 30);
        let [a, b, c] = publish_chain(&mut h, &stream, &[100, 300, 600])[..] else {
            unreachable!()
        };
        // A restore from b is in flight.
        let pin = h.store.pin(b).unwrap();
        let restore = h.store.begin_use(&pin);
        h.store.unpin(pin);
        // b would be the interior choice; in use, the root a goes instead.
        let first = h.store.reserve_snapshot().unwrap();
        assert_eq!(first.eviction.thinned, vec![a]);
        // b is now a root with one child, still in use: the leaf c goes.
        let second = h.store.reserve_snapshot().unwrap();
        assert_eq!(second.eviction.evicted, vec![c]);
        assert!(h.store.reserve_snapshot().is_err());
        h.apply(first.eviction);
        h.apply(second.eviction);
        h.check(&[]);
        h.store.end_use(restore);
        let third = h.store.reserve_snapshot().unwrap();
        assert_eq!(third.eviction.evicted, vec![b]);
        h.apply(third.eviction);
        for reservation in [first.reservation, second.reservation, third.reservation] {
            h.store.release_reservation(reservation);
        }
        h.drain(Vec::new());
    });
}

#[test]
fn a_pinned_checkpoint_keeps_a_valid_chain_while_its_ancestors_are_thinned() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 64);
        let stream = tokens(900, 40);
        let ids = publish_chain(&mut h, &stream, &[90, 250, 470, 610]);
        // A request restores from the deepest and keeps running.
        let mut r = h.admit(&stream, 800).unwrap();
        assert_eq!(r.reused, 610);
        let mut reservations = Vec::new();
        for _ in 0..3 {
            let grant = h.store.reserve_snapshot().unwrap();
            assert_eq!(grant.eviction.thinned.len(), 1);
            h.apply(grant.eviction);
            reservations.push(grant.reservation);
            h.check(&[&r]);
        }
        let survivor = h.store.checkpoint(ids[3]).unwrap();
        assert_eq!((survivor.parent, survivor.pins), (None, 1));
        // The pinned leaf and every row left are retained: no more rows.
        assert!(h.store.reserve_snapshot().is_err());
        h.consume(&mut r, 800).unwrap();
        h.check(&[&r]);
        for reservation in reservations {
            h.store.release_reservation(reservation);
        }
        h.drain(vec![r]);
    });
}

#[test]
fn a_superseded_leaf_goes_before_any_thinning() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 64);
        let stream = tokens(800, 1);
        // A turn's checkpoints: a message endpoint, the prompt end and the
        // terminal boundary after its reply.
        let [c100, c400, c415] = publish_chain(&mut h, &stream, &[100, 400, 415])[..] else {
            unreachable!()
        };
        // The next turn renders the reply otherwise: it extends 400, not 415.
        let mut next = stream[..400].to_vec();
        next.extend(tokens(200, 2));
        let mut r = h.admit(&next, 500).unwrap();
        assert_eq!(r.reused, 400);
        let Capture::New(c500) = h.capture_at(&mut r, 500) else {
            panic!("a new endpoint")
        };
        h.finish(r);
        let grant = h.store.reserve_snapshot().unwrap();
        // c100 could be thinned (a root with one child); the superseded
        // terminal checkpoint goes first, with its private page when it has one.
        assert_eq!(grant.eviction.evicted, vec![c415]);
        assert!(grant.eviction.thinned.is_empty());
        h.apply(grant.eviction);
        let first = grant.reservation;
        assert_eq!(h.store.metrics().superseded, 1);
        // Then the design's order: 400 (interior, one child now) is thinned.
        let grant = h.store.reserve_snapshot().unwrap();
        assert_eq!(grant.eviction.thinned, vec![c400]);
        h.apply(grant.eviction);
        h.store.release_reservation(grant.reservation);
        h.store.release_reservation(first);
        assert_eq!(hit_tokens(&h, &next, 500), Some(500));
        assert_eq!(h.store.checkpoint(c500).unwrap().parent, Some(c100));
        h.check(&[]);
    });
}

#[test]
fn a_branch_tip_published_after_its_sibling_is_not_superseded() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 64);
        let stream = tokens(800, 3);
        let [_, c400, c500, _] = publish_chain(&mut h, &stream, &[100, 400, 500, 600])[..] else {
            unreachable!()
        };
        // A fork of 400, published after the main line's 500: its tip is
        // the fork's latest endpoint, kept while a chain can be thinned.
        let mut fork = stream[..400].to_vec();
        fork.extend(tokens(100, 4));
        let mut r = h.admit(&fork, 450).unwrap();
        assert_eq!(r.reused, 400);
        // Four rows are held: the capture thins the main line's interior 500.
        let Capture::New(tip) = h.capture_at(&mut r, 450) else {
            panic!("a new endpoint")
        };
        h.finish(r);
        assert_eq!(h.store.checkpoint(tip).unwrap().parent, Some(c400));
        assert!(h.store.checkpoint(c500).is_none(), "500 was thinned");
        assert_eq!(h.store.metrics().superseded, 0);
        h.check(&[]);
    });
}

/// One agent turn: the prompt's new message endpoints and its end, each
/// captured unless restored, then the terminal boundary after `reply`
/// tokens (its last one pending). Returns the tokens the turn restored.
fn agent_turn(h: &mut Harness, prompt: &[u32], endpoints: &[u32], reply: &[u32]) -> u32 {
    let mut stream = prompt.to_vec();
    stream.extend(reply);
    let end = prompt.len() as u32;
    let mut r = h.admit(&stream, end).unwrap();
    let reused = r.reused;
    for &e in endpoints.iter().filter(|&&e| e > reused).chain([&end]) {
        assert!(!matches!(h.capture_at(&mut r, e), Capture::Refused));
    }
    let terminal = end + reply.len() as u32 - 1;
    assert!(!matches!(h.capture_at(&mut r, terminal), Capture::Refused));
    h.finish(r);
    reused
}

#[test]
fn an_agent_trace_keeps_sparse_coverage_for_a_fork_of_an_early_turn() {
    // The hybrid at its H200 geometry holds 36 snapshot rows. Each turn
    // appends a reply rendered otherwise than sampled (its first token
    // differs) and a tool result; the next turn extends the prompt end, so
    // every terminal checkpoint is superseded. Before superseded leaves went
    // first, only the last 18 turns' checkpoints survived and a fork of
    // turn 48 after 88 turns restored nothing (on the H200 too: 0 of its
    // 23,286 shared tokens, 2.7 s to first token).
    for recipe in Recipe::ALL {
        for page_tokens in [64, 256] {
            let mut h = Harness::new(recipe, page_tokens, 36, 4096);
            let mut prompt = tokens(1469, 7);
            let mut prompts = Vec::new();
            let mut reply = tokens(16, 3000);
            for turn in 0..89u64 {
                let mut endpoints = Vec::new();
                if turn > 0 {
                    let mut rendered = reply.clone();
                    rendered[0] ^= 1;
                    rendered.push(9);
                    prompt.extend(&rendered);
                    endpoints.push(prompt.len() as u32);
                    prompt.extend(tokens(400, 2000 + turn));
                    endpoints.push(prompt.len() as u32);
                    prompt.extend([1, 2, 3]);
                }
                reply = tokens(16, 3000 + turn);
                let restored = agent_turn(&mut h, &prompt, &endpoints, &reply);
                let previous = prompts.last().map_or(0, |p: &Vec<u32>| p.len() as u32);
                assert_eq!(restored, previous, "turn {turn} restores the last prompt");
                prompts.push(prompt.clone());
            }
            // A fork of turn 48: its prompt, the reply, another tool result.
            let shared = prompts[48].len() as u32;
            let mut fork = prompts[48].clone();
            fork.extend(tokens(17, 5000));
            fork.extend(tokens(400, 5001));
            let hit = hit_tokens(&h, &fork, fork.len() as u32).expect("a restore");
            assert!(
                hit <= shared && shared - hit < 2_000,
                "{recipe:?} at {page_tokens}: restored {hit} of {shared} shared tokens"
            );
            // Coverage reaches back to the first turn.
            let oldest = h
                .store
                .ids()
                .map(|id| h.store.checkpoint(id).unwrap().tokens())
                .min();
            assert_eq!(oldest, Some(1469));
            assert!(h.store.metrics().superseded > 0);
            h.check(&[]);
        }
    }
}
