//! Checkpoint lifecycles across page geometries (64, 128, 256 tokens) and
//! row layouts (dense, synthetic recurrent): message, prompt and terminal
//! checkpoints, whole-prompt hits, branches restoring into private partial
//! pages, duplicate publications, endpoints around page boundaries.

mod prefix_support;

use helios::prefix::{
    capture_budget, select_captures, terminal_endpoint, CaptureRequest, PrefixChain, PrefixError,
    Publication,
};
use prefix_support::{tokens, Capture, Harness, Recipe, GEOMETRIES};

fn each_geometry(test: impl Fn(Recipe, u32)) {
    for recipe in Recipe::ALL {
        for page_tokens in GEOMETRIES {
            test(recipe, page_tokens);
        }
    }
}

#[test]
fn message_prompt_and_terminal_checkpoints_then_the_next_turn_appends() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 16, 64);
        // A 700-token prompt with three messages, 50 sampled output tokens:
        // the last one stays pending.
        let stream = tokens(750, 1);
        let plan = select_captures(&CaptureRequest {
            budget: capture_budget(32, 4),
            reused: 0,
            prompt_tokens: 700,
            max_new_tokens: 50,
            message_endpoints: &[100, 300, 520],
        });
        assert_eq!(plan.prefill_stops(700), vec![100, 300, 520, 700]);
        assert!(plan.terminal);
        let mut r = h.admit(&stream, 700).unwrap();
        assert_eq!(r.reused, 0);
        for stop in plan.prefill_stops(700) {
            assert!(matches!(h.capture_at(&mut r, stop), Capture::New(_)));
        }
        let terminal = terminal_endpoint(stream.len() as u32, true);
        assert_eq!(terminal, 749);
        let Capture::New(last) = h.capture_at(&mut r, terminal) else {
            panic!("the terminal capture publishes");
        };
        h.check(&[&r]);
        // One chain, each checkpoint the parent of the next.
        let mut at = Some(last);
        let mut endpoints = Vec::new();
        while let Some(id) = at {
            let info = h.store.checkpoint(id).unwrap();
            endpoints.push(info.tokens());
            at = info.parent;
        }
        assert_eq!(endpoints, vec![749, 700, 520, 300, 100]);
        assert_eq!(h.store.metrics().published, 5);
        h.finish(r);

        // The next turn appends a tool result to the whole history: only
        // the unconsumed tokens are prefilled.
        let mut next = stream.clone();
        next.extend(tokens(60, 2));
        let mut r = h.admit(&next, 790).unwrap();
        assert_eq!(r.reused, 749);
        h.consume(&mut r, 790).unwrap();
        h.check(&[&r]);
        h.finish(r);

        // A whole-prompt hit: the row restores, nothing is recomputed and
        // resume sampling starts from the saved hidden vector.
        let mut same = stream[..700].to_vec();
        same.extend(tokens(10, 3));
        let r = h.admit(&same, 700).unwrap();
        assert_eq!((r.reused, r.consumed()), (700, 700));
        h.check(&[&r]);
        h.finish(r);
        assert_eq!(h.store.metrics().hit_tokens, 749 + 700);
        h.drain(Vec::new());
    });
}

#[test]
fn one_output_token_shares_the_prompt_and_terminal_checkpoint() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 16);
        let stream = tokens(201, 4);
        let plan = select_captures(&CaptureRequest {
            budget: 4,
            reused: 0,
            prompt_tokens: 200,
            max_new_tokens: 1,
            message_endpoints: &[],
        });
        assert!(plan.terminal && !plan.prompt);
        let mut r = h.admit(&stream, 200).unwrap();
        let terminal = terminal_endpoint(201, true);
        assert_eq!(terminal, 200);
        let Capture::New(id) = h.capture_at(&mut r, terminal) else {
            panic!("published");
        };
        // Capturing the same endpoint again is a duplicate of it.
        assert_eq!(h.capture(&mut r), Capture::Duplicate(id));
        assert_eq!(h.store.pressure().rows.free, 3);
        h.check(&[&r]);
        h.drain(vec![r]);
    });
}

#[test]
fn branches_pin_their_ancestor_and_restore_into_private_partial_pages() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 3, 64);
        let trunk = tokens(150, 5);
        let mut parent = h.admit(&[trunk.clone(), vec![1]].concat(), 150).unwrap();
        let Capture::New(ancestor) = h.capture_at(&mut parent, 150) else {
            panic!("published");
        };
        h.finish(parent);

        let mut branches = Vec::new();
        for seed in [6, 7] {
            let stream = [trunk.clone(), tokens(101, seed)].concat();
            let branch = h.admit(&stream, 251).unwrap();
            assert_eq!(branch.reused, 150);
            // 150 is never page-aligned here: a private tail page each.
            assert_eq!(branch.pages.len(), branch.shared + 1);
            branches.push(branch);
        }
        let (a, b) = (&branches[0], &branches[1]);
        assert_eq!(a.pages[..a.shared], b.pages[..b.shared]);
        assert_ne!(a.pages[a.shared], b.pages[b.shared]);
        assert_eq!(h.store.checkpoint(ancestor).unwrap().pins, 2);
        for branch in &mut branches {
            let terminal = terminal_endpoint(branch.stream.len() as u32, true);
            assert!(matches!(h.capture_at(branch, terminal), Capture::New(_)));
        }
        let info = h.store.checkpoint(ancestor).unwrap();
        assert_eq!((info.pins, info.children.len()), (0, 2));
        h.check(&branches.iter().collect::<Vec<_>>());

        // Every row is held by the branching ancestor or a pinned leaf.
        let refused = h.store.reserve_snapshot().unwrap_err();
        assert_eq!((refused.rows, refused.reserved), (3, 0));
        assert_eq!(h.store.metrics().snapshot_refusals, 1);

        // One branch ends: its leaf is evicted for the next row, and the
        // ancestor, no longer branching, keeps its snapshot until pressure
        // thins it into the surviving branch.
        let ended = branches.remove(0);
        h.finish(ended);
        let first = h.launch_snapshot(&branches[0]).unwrap();
        assert_eq!(h.store.metrics().evicted, 1);
        assert!(h.store.checkpoint(ancestor).is_some());
        let second = h.launch_snapshot(&branches[0]).unwrap();
        assert!(h.store.checkpoint(ancestor).is_none());
        assert_eq!(h.store.metrics().thinned, 1);
        // The surviving branch's chain is unchanged: its page table still
        // matches its pinned checkpoint, which now owns the trunk's pages.
        h.check(&[&branches[0]]);
        h.store.release_reservation(first);
        h.store.release_reservation(second);
        h.drain(branches);
    });
}

#[test]
fn a_duplicate_publication_releases_only_its_reservation() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 64);
        let stream = tokens(400, 8);
        // Two requests for the same prompt, both admitted before either
        // published: both compute it.
        let mut first = h.admit(&stream, 300).unwrap();
        let mut second = h.admit(&stream, 300).unwrap();
        assert_eq!(first.reused + second.reused, 0);
        let Capture::New(id) = h.capture_at(&mut first, 300) else {
            panic!("published");
        };
        h.consume(&mut second, 300).unwrap();
        let private_before = second.pages.clone();
        let free_before = h.store.pressure().rows.free;
        assert_eq!(h.capture(&mut second), Capture::Duplicate(id));
        // The reservation went back; the second keeps its own pages and
        // its (absent) parent, and shares nothing with the first.
        assert_eq!(h.store.pressure().rows.free, free_before);
        assert_eq!(second.pages, private_before);
        assert!(second.pin.is_none() && second.shared == 0);
        assert!(first.pages[..first.shared]
            .iter()
            .all(|p| !second.pages.contains(p)));
        assert_eq!(h.store.metrics().duplicate_publications, 1);
        // Its terminal capture starts a chain of its own pages.
        let Capture::New(own) = h.capture_at(&mut second, 399) else {
            panic!("published");
        };
        assert_eq!(h.store.checkpoint(own).unwrap().parent, None);
        h.check(&[&first, &second]);
        h.drain(vec![first, second]);
    });
}

#[test]
fn endpoints_just_before_at_and_after_page_boundaries() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 8, 64);
        for (i, t) in [
            page_tokens - 1,
            page_tokens,
            page_tokens + 1,
            2 * page_tokens - 1,
            2 * page_tokens,
            2 * page_tokens + 1,
        ]
        .into_iter()
        .enumerate()
        {
            let stream = tokens(t as usize + 40, 100 + i as u64);
            let mut writer = h.admit(&stream, t).unwrap();
            let Capture::New(id) = h.capture_at(&mut writer, t) else {
                panic!("published");
            };
            h.finish(writer);
            let mut reader = h.admit(&stream, t + 20).unwrap();
            assert_eq!(reader.reused, t);
            let aligned = t.is_multiple_of(page_tokens);
            assert_eq!(reader.pages.len(), reader.shared + usize::from(!aligned));
            assert_eq!(reader.shared as u32, t / page_tokens);
            // Continuing past the endpoint writes only private pages.
            h.consume(&mut reader, t + 20).unwrap();
            h.check(&[&reader]);
            h.check_checkpoint(id);
            h.finish(reader);
        }
        h.drain(Vec::new());
    });
}

#[test]
fn a_restore_into_a_page_used_before_at_the_same_position_is_exact() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 64);
        let t = page_tokens + 10;
        let stream = tokens(t as usize + 60, 9);
        let mut writer = h.admit(&stream, t).unwrap();
        assert!(matches!(h.capture_at(&mut writer, t), Capture::New(_)));
        h.finish(writer);
        // A first reader fills its private tail page past the endpoint.
        let mut first = h.admit(&stream, t + 50).unwrap();
        let tail = first.pages[first.shared];
        h.consume(&mut first, t + 50).unwrap();
        h.finish(first);
        // The second reader gets that very page for the same position.
        h.device.free.retain(|&p| p != tail);
        h.device.free.push_front(tail);
        let mut second = h.admit(&stream, t + 50).unwrap();
        assert_eq!(second.pages[second.shared], tail);
        h.check(&[&second]);
        h.consume(&mut second, t + 50).unwrap();
        h.check(&[&second]);
        h.drain(vec![second]);
    });
}

#[test]
fn a_preempted_request_readmits_from_its_terminal_checkpoint() {
    each_geometry(|recipe, page_tokens| {
        let mut h = Harness::new(recipe, page_tokens, 4, 64);
        let stream = tokens(901, 11);
        let mut r = h.admit(&stream, 600).unwrap();
        // Preempted after consuming 730 tokens (prompt and some output):
        // the terminal capture, then everything goes back.
        let Capture::New(terminal) = h.capture_at(&mut r, 730) else {
            panic!("published");
        };
        h.finish(r);
        assert_eq!(h.store.pressure().pages.held, 730 / page_tokens);
        // Readmitted with its history: nothing consumed is recomputed.
        let mut r = h.admit(&stream, 730).unwrap();
        assert_eq!((r.reused, r.consumed()), (730, 730));
        assert_eq!(r.pin.as_ref().map(|p| p.checkpoint()), Some(terminal));
        h.consume(&mut r, 900).unwrap();
        h.check(&[&r]);
        h.drain(vec![r]);
    });
}

#[test]
fn publications_that_break_the_rules_are_rejected_with_everything_back() {
    let mut h = Harness::new(Recipe::Dense, 64, 2, 16);
    let stream = tokens(300, 10);
    let mut r = h.admit(&stream, 200).unwrap();
    assert!(matches!(h.capture_at(&mut r, 100), Capture::New(_)));
    h.consume(&mut r, 200).unwrap();
    let reservation = h.launch_snapshot(&r).unwrap();
    let mut publication = Publication {
        reservation,
        parent: r.pin.take(),
        endpoint: 200,
        extension_only: false,
        pages: r.pages[1..2].to_vec(),
    };
    let mut reject = |publication: Publication, chain: &PrefixChain, error: PrefixError| {
        let rejected = h.store.publish(chain, publication).unwrap_err();
        assert_eq!(rejected.error, error);
        rejected.publication
    };
    // 200 tokens complete pages 1 and 2 past the parent's one page.
    publication = reject(
        publication,
        &r.chain,
        PrefixError::PageCount {
            expected: 2,
            given: 1,
        },
    );
    publication.pages = vec![r.pages[1], r.pages[0]];
    let shared = r.pages[0];
    publication = reject(
        publication,
        &r.chain,
        PrefixError::PageNotPrivate { page: shared },
    );
    publication.pages = r.pages[1..3].to_vec();
    let parent = publication.parent.as_ref().unwrap().checkpoint();
    let other = PrefixChain::new(b"another model", &stream[..200]);
    publication = reject(publication, &other, PrefixError::ParentNotPrefix { parent });
    publication.endpoint = 50;
    publication = reject(
        publication,
        &r.chain,
        PrefixError::EndpointNotAfterParent {
            endpoint: 50,
            parent_tokens: 100,
        },
    );
    publication.endpoint = 201;
    publication = reject(
        publication,
        &r.chain,
        PrefixError::EndpointBeyondChain {
            endpoint: 201,
            tokens: 200,
        },
    );
    // Nothing was lost: the pin and the reservation are handed back.
    r.pin = publication.parent;
    h.store.release_reservation(publication.reservation);
    assert_eq!(h.store.outstanding().pins, 1);
    assert_eq!(h.store.outstanding().reservations, 0);
    h.check(&[&r]);
    h.drain(vec![r]);
}
