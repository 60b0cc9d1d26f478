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

#[test]
fn into_seqs_keeps_only_the_lists_asked_for_mapped_in_place() {
    // [[1, 2], [3], [4, 5, 6]] with protocol 2 opcodes: a list of three
    // lists, each filled with MARK ... APPENDS.
    let mut p = vec![0x80, 2, b']', b'('];
    p.extend([b']', b'(', b'K', 1, b'K', 2, b'e']);
    p.extend([b']', b'(', b'K', 3, b'e']);
    p.extend([b']', b'(', b'K', 4, b'K', 5, b'K', 6, b'e']);
    p.extend([b'e', b'.']);
    let d = ok(&p);
    let outer = d.as_seq(d.root()).unwrap().to_vec();
    let want: Vec<Vec<i64>> = [outer[2], outer[0], outer[2]]
        .iter()
        .map(|&l| {
            d.as_seq(l)
                .unwrap()
                .iter()
                .map(|&i| d.as_int(i).unwrap())
                .collect()
        })
        .collect();
    // The third list, the first, the third again, and the root's integer
    // (not a list: empty); each element mapped to its value times ten.
    let ints: Vec<i64> = (0..d.len() as u32)
        .map(|i| d.as_int(i).unwrap_or(-1))
        .collect();
    let (pool, runs) = d.into_seqs(&[outer[2], outer[0], outer[2], 3], |e| {
        (ints[e as usize] * 10) as u32
    });
    let got: Vec<Vec<i64>> = runs[..3]
        .iter()
        .map(|&(s, n)| {
            pool[s as usize..(s + n) as usize]
                .iter()
                .map(|&x| x as i64 / 10)
                .collect()
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(runs[3].1, 0);
    // Only the lists asked for are kept (the root's elements are not).
    assert_eq!(pool.len(), 5);
}
