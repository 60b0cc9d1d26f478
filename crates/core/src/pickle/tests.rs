//! The reader against pickles written by hand (opcode by opcode); files
//! written by Python are read in `tests/snapfile*.rs`.
use super::*;

fn ok(b: &[u8]) -> Doc {
    parse_slice(b).unwrap_or_else(|e| panic!("{e}"))
}

fn err(b: &[u8]) -> PickleError {
    parse_slice(b).expect_err("refused")
}

#[test]
fn reads_a_dict_of_plain_values() {
    // pickle.dumps({'a': [1, -2, 300, 70000, 2**40, None, True, 1.5], 'b': ('x',)}, 4)
    // written opcode by opcode.
    let mut p = vec![0x80, 4, b'}', 0x94, b'('];
    p.extend([0x8c, 1, b'a', 0x94, b']', 0x94, b'(']);
    p.extend([b'K', 1, b'J', 0xfe, 0xff, 0xff, 0xff, b'M', 0x2c, 0x01]);
    p.extend([b'J', 0x70, 0x11, 0x01, 0x00]);
    p.extend([0x8a, 6, 0, 0, 0, 0, 0, 1]);
    p.extend([b'N', 0x88, b'G']);
    p.extend(1.5f64.to_be_bytes());
    p.extend([
        b'e', 0x8c, 1, b'b', 0x94, 0x8c, 1, b'x', 0x94, 0x85, 0x94, b'u', b'.',
    ]);
    let d = ok(&p);
    let root = d.root();
    let a = d.as_seq(d.get(root, "a").unwrap()).unwrap();
    let ints: Vec<_> = a[..5].iter().map(|&i| d.as_int(i).unwrap()).collect();
    assert_eq!(ints, [1, -2, 300, 70000, 1 << 40]);
    assert_eq!(d.value(a[5]), Value::None);
    assert_eq!(d.value(a[6]), Value::Bool(true));
    assert_eq!(d.value(a[7]), Value::Float(1.5));
    let b = d.as_seq(d.get(root, "b").unwrap()).unwrap();
    assert_eq!(d.as_str(b[0]), Some("x"));
}

#[test]
fn a_memo_reference_is_the_same_value() {
    // [{'f': 1}, <memo 1>, <memo 1>]
    let p = [
        0x80, 4, b']', 0x94, b'(', b'}', 0x94, 0x8c, 1, b'f', 0x94, b'K', 1, b's', b'h', 1, b'h',
        1, b'e', b'.',
    ];
    let d = ok(&p);
    let l = d.as_seq(d.root()).unwrap();
    assert_eq!(l.len(), 3);
    assert!(l[0] == l[1] && l[1] == l[2]);
    // One list, one dict, one string, one int: nothing copied.
    assert_eq!(d.len(), 4);
}

#[test]
fn a_list_filled_in_batches_keeps_its_order() {
    // Python's pickler appends 1,000 at a time, with the next elements'
    // own containers in between.
    let mut p = vec![0x80, 4, b']', b'('];
    for i in 0..3u8 {
        p.extend([b']', b'(', b'K', i, b'e']);
    }
    p.push(b'e');
    p.extend([b'(', b']', b'(', b'K', 9, b'e', b'e', b'.']);
    let d = ok(&p);
    let outer = d.as_seq(d.root()).unwrap();
    assert_eq!(outer.len(), 4);
    let firsts: Vec<_> = outer
        .iter()
        .map(|&l| d.as_int(d.as_seq(l).unwrap()[0]).unwrap())
        .collect();
    assert_eq!(firsts, [0, 1, 2, 9]);
}

#[test]
fn long_integers_are_sign_extended() {
    let p = [0x80, 2, 0x8a, 2, 0x00, 0x80, b'.'];
    assert_eq!(ok(&p).as_int(0), Some(-32768));
    let p = [0x80, 2, 0x8a, 0, b'.'];
    assert_eq!(ok(&p).as_int(0), Some(0));
}

#[test]
fn every_refusal_names_its_offset() {
    let cases: &[(&[u8], u64, &str)] = &[
        (b"", 0, "empty"),
        (&[0x80, 4, b']'], 3, "truncated"),
        (
            &[0x80, 4, b'X', 5, 0, 0, 0, b'a'],
            2,
            "only 1 bytes are left",
        ),
        (&[0x80, 9], 0, "protocol 9"),
        (b"\x80\x04cos\nsystem\n.", 2, "GLOBAL os.system"),
        (
            b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
            14,
            "STACK_GLOBAL os.system",
        ),
        (&[0x80, 4, b')', b'R'], 3, "REDUCE"),
        (&[0x80, 4, b'h', 3], 2, "memo index 3 was never stored"),
        (&[0x80, 4, b'N', b'r', 9, 0, 0, 0], 3, "skips ahead"),
        (&[0x80, 4, b'N', b'a'], 3, "APPEND with no list"),
        (&[0x80, 4, b'K', 1, b'N', b'a'], 5, "APPEND to a int"),
        (
            &[0x80, 4, b'N', b'N', b'.'],
            4,
            "STOP with other than one value",
        ),
        (&[0x80, 4, 0x8c, 2, 0xff, 0xfe, b'.'], 2, "not UTF-8"),
        (&[0x80, 4, 0x8b, 9, 0, 0, 0], 2, "integer of 9 bytes"),
        (b"%PDF-1.4", 0, "opcode 0x25"),
    ];
    for (bytes, offset, what) in cases {
        let e = err(bytes);
        assert_eq!(e.offset, *offset, "{e}");
        assert!(e.to_string().contains(what), "{e} (wanted {what})");
    }
}

#[test]
fn a_string_longer_than_the_file_is_refused_before_allocation() {
    let mut p = vec![0x80, 4, 0x8d];
    p.extend((1u64 << 62).to_le_bytes());
    let e = err(&p);
    assert!(e.why.contains("only 0 bytes are left"), "{e}");
}

#[test]
fn nesting_beyond_the_bound_is_refused() {
    let p = vec![b'('; MAX_DEPTH + 1];
    let e = err(&p);
    assert_eq!(e.offset, MAX_DEPTH as u64);
    assert!(e.why.contains("deeper than"), "{e}");
}

#[test]
fn values_beyond_four_times_the_file_are_refused() {
    // `]0` pushes and pops an empty list: 16 bytes of node per 2 bytes of
    // file. With the budget at 4× + 64 MiB, about 9.5 M of them fit.
    let n = 10_000_000usize;
    let mut p = Vec::with_capacity(2 * n + 3);
    p.extend([0x80, 4]);
    for _ in 0..n {
        p.extend([b']', b'0']);
    }
    p.extend([b'N', b'.']);
    let e = err(&p);
    assert!(e.why.contains("a bomb"), "{e}");
}

/// Takes dicts with a key `k`; the token is its integer.
#[derive(Default)]
struct TakeK {
    forgotten: Vec<Id>,
}

impl Take for TakeK {
    fn take(&mut self, doc: &Doc, item: Id, _: usize) -> Option<u32> {
        doc.as_int(doc.get(item, "k")?).map(|k| k as u32)
    }
    fn token_of(&self, _: Id) -> Option<u32> {
        None
    }
    fn forget(&mut self, from: Id) {
        self.forgotten.push(from);
    }
    fn memory_bytes(&self) -> usize {
        0
    }
}

fn taking(b: &[u8]) -> (Doc, TakeK) {
    let mut t = TakeK::default();
    let d = parse_taking(b, b.len() as u64, &mut t).unwrap_or_else(|e| panic!("{e}"));
    (d, t)
}

#[test]
fn dicts_taken_while_parsing_are_tokens_everywhere_and_the_arena_is_cut_back() {
    // [{'k': 1}, {'k': 2}, {'k': 3}] with MARK ... APPENDS, then the
    // second dict again through the memo (one APPEND).
    let mut p = vec![0x80, 4, b']', 0x94, b'('];
    p.extend([b'}', 0x94, 0x8c, 1, b'k', 0x94, b'K', 1, b's']);
    p.extend([b'}', 0x94, b'h', 2, b'K', 2, b's']);
    p.extend([b'}', 0x94, b'h', 2, b'K', 3, b's']);
    p.extend([b'e', b'h', 3, b'a', b'.']);
    let (d, t) = taking(&p);
    let l = d.as_seq(d.root()).unwrap();
    let got: Vec<_> = l.iter().map(|&i| d.value(i)).collect();
    use Value::Taken;
    assert_eq!(got, [Taken(1), Taken(2), Taken(3), Taken(2)]);
    // Cut back to the list, then the key string moved down (the memo
    // still names it): two values, where the plain parse has eight.
    assert_eq!(t.forgotten, [1]);
    assert_eq!(d.len(), 2);
    assert_eq!(d.as_str(1), Some("k"));
    assert_eq!(ok(&p).len(), 8);
}

#[test]
fn a_batch_reachable_from_an_older_list_is_not_cut() {
    // O = {}, L = [], then in L's batch: D = {'k': 1}, set as O['x'] too
    // (through the memo) before L's APPENDS; the root is (O, L).
    let mut p = vec![0x80, 4, b'}', 0x94, b']', 0x94, b'('];
    p.extend([b'}', 0x94, 0x8c, 1, b'k', 0x94, b'K', 1, b's']);
    p.extend([
        b'h', 0, 0x8c, 1, b'x', b'h', 2, b's', b'0', b'e', 0x86, b'.',
    ]);
    let (d, t) = taking(&p);
    assert!(t.forgotten.is_empty(), "nothing cut");
    let root = d.as_seq(d.root()).unwrap();
    let l = d.as_seq(root[1]).unwrap();
    assert_eq!(d.value(l[0]), Value::Taken(1));
    // O still holds the dict itself, whole.
    let x = d.get(root[0], "x").unwrap();
    assert_eq!(d.as_int(d.get(x, "k").unwrap()), Some(1));
}

#[test]
fn an_append_to_a_value_taken_is_refused() {
    // [{'k': 1}] then APPEND to the dict through the memo.
    let p = [
        0x80, 4, b']', 0x94, b'(', b'}', 0x94, 0x8c, 1, b'k', 0x94, b'K', 1, b's', b'K', 0, b'e',
        b'h', 1, b'N', b'a', b'.',
    ];
    let mut t = TakeK::default();
    let e = parse_taking(&p[..], p.len() as u64, &mut t).expect_err("refused");
    assert!(e.why.contains("APPEND to a value taken"), "{e}");
    assert_eq!(e.offset, 20);
}

#[test]
fn a_change_made_under_an_inner_mark_keeps_the_batch_whole() {
    // O = [], L = [], then in L's batch: D = {'k': 1}, and under a mark
    // of its own (popped with POP_MARK) a new list M appended to O; the
    // root is (O, L). The change to O is handed down to the batch's mark
    // when the inner one is popped: nothing is cut, O keeps M.
    let mut p = vec![0x80, 4, b']', 0x94, b']', 0x94, b'('];
    p.extend([b'}', 0x94, 0x8c, 1, b'k', 0x94, b'K', 1, b's']);
    p.extend([b'(', b'h', 0, b']', b'a', b'1', b'e', 0x86, b'.']);
    let (d, t) = taking(&p);
    assert!(t.forgotten.is_empty(), "nothing cut");
    let root = d.as_seq(d.root()).unwrap();
    let l = d.as_seq(root[1]).unwrap();
    assert_eq!(d.value(l[0]), Value::Taken(1));
    let o = d.as_seq(root[0]).unwrap();
    assert_eq!(d.value(o[0]), Value::List(&[]));
}

#[test]
fn an_older_memo_entry_overwritten_in_a_batch_keeps_it_whole() {
    // L = [], X = None (memo 1), then in L's batch, under an outer mark
    // that stays: D = {'k': 1}, stored over memo 1. Memo 1 must still
    // name D whole after the batch.
    let mut p = vec![0x80, 4, b'(', b']', 0x94, b'N', 0x94, b'0', b'('];
    p.extend([b'}', 0x94, 0x8c, 1, b'k', 0x94, b'K', 1, b's', b'q', 1]);
    p.extend([b'e', b'h', 1, b't', b'.']);
    let (d, t) = taking(&p);
    assert!(t.forgotten.is_empty(), "nothing cut");
    let root = d.as_seq(d.root()).unwrap();
    assert_eq!(d.value(d.as_seq(root[0]).unwrap()[0]), Value::Taken(1));
    assert_eq!(d.as_int(d.get(root[1], "k").unwrap()), Some(1));
}
