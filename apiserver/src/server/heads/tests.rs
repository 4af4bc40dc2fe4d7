use super::{Charge, FREE_BYTES, Pool};

#[test]
fn heads_under_the_free_bytes_take_nothing() {
    let pool = Pool::new(0);
    let charge = Charge::new(pool.clone());
    charge.read(FREE_BYTES).expect("free");
    assert_eq!(pool.used(), 0);
    charge.read(1).expect_err("the pool is empty");
}

#[test]
fn the_pool_is_shared_and_given_back() {
    let pool = Pool::new(100 * 1024);
    let first = Charge::new(pool.clone());
    let second = Charge::new(pool.clone());
    first.read(FREE_BYTES + 60 * 1024).expect("fits");
    assert_eq!(pool.used(), 60 * 1024);
    second.read(FREE_BYTES + 30 * 1024).expect("fits");
    second.read(20 * 1024).expect_err("over the pool");
    // A request began on the first: its share is back.
    first.consumed();
    assert_eq!(pool.used(), 30 * 1024);
    second.read(20 * 1024).expect("fits now");
    assert_eq!(pool.used(), 70 * 1024);
    drop(second);
    assert_eq!(pool.used(), 0);
    drop(first);
    assert_eq!(pool.used(), 0);
}

#[test]
fn reads_after_a_request_start_from_zero() {
    let pool = Pool::new(16 * 1024);
    let charge = Charge::new(pool.clone());
    for _ in 0..100 {
        charge.read(FREE_BYTES + 16 * 1024).expect("one head fits");
        charge.consumed();
    }
    assert_eq!(pool.used(), 0);
}
