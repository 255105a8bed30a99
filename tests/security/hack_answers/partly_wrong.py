def f(xs):
    return sum(x for x in xs if x > 0) + 3
