package model

import (
	"math"
	"slices"
)

// lsqResult is an ordinary least-squares fit y ≈ b₀ + Σ bⱼxⱼ.
type lsqResult struct {
	intercept float64
	slopes    []float64 // one per column; 0 for a dropped column
	used      []bool    // whether the column was fitted (not degenerate)
	r2        *float64  // nil when y has no variance
	rmse      float64
}

// lsq fits y on the columns of x (x[i] is row i) by least squares, with an
// intercept when withIntercept. Columns without information (no variance
// around the intercept, or all zero without one) are dropped and their
// slope is 0. It reports false when fewer rows than coefficients remain or
// the normal equations are singular.
func lsq(x [][]float64, y []float64, withIntercept bool) (lsqResult, bool) {
	return wlsq(x, y, nil, withIntercept)
}

// relWeights returns weights 1/y² that make least squares minimise relative
// errors (timings scatter in proportion to their size), or nil when some y
// is not positive.
func relWeights(y []float64) []float64 {
	w := make([]float64, len(y))
	var sum float64
	for i, v := range y {
		if !(v > 0) {
			return nil
		}
		w[i] = 1 / (v * v)
		sum += w[i]
	}
	for i := range w { // mean 1, for conditioning
		w[i] *= float64(len(w)) / sum
	}
	return w
}

// wlsq is lsq with a weight per row (nil: all 1). R² and RMSE are reported
// unweighted, on the fitted coefficients.
func wlsq(x [][]float64, y, w []float64, withIntercept bool) (lsqResult, bool) {
	n := len(y)
	if n == 0 {
		return lsqResult{}, false
	}
	k := 0
	if n > 0 && len(x) > 0 {
		k = len(x[0])
	}
	res := lsqResult{slopes: make([]float64, k), used: make([]bool, k)}
	var cols []int
	for j := 0; j < k; j++ {
		var mean, ss, abs float64
		for i := range n {
			mean += x[i][j] / float64(n)
			abs += math.Abs(x[i][j])
		}
		for i := range n {
			ss += (x[i][j] - mean) * (x[i][j] - mean)
		}
		if (withIntercept && ss > 1e-12*(1+mean*mean)*float64(n)) || (!withIntercept && abs > 0) {
			cols = append(cols, j)
		}
	}
	// Design matrix columns: [1] + cols.
	dim := len(cols)
	if withIntercept {
		dim++
	}
	if dim == 0 || n < dim {
		return res, false
	}
	row := func(i int) []float64 {
		r := make([]float64, 0, dim)
		if withIntercept {
			r = append(r, 1)
		}
		for _, j := range cols {
			r = append(r, x[i][j])
		}
		return r
	}
	// Normal equations AᵀA b = Aᵀy, columns scaled to unit magnitude for
	// conditioning (state sizes are ~10⁸ next to an intercept of 1).
	scale := make([]float64, dim)
	for i := range n {
		for c, v := range row(i) {
			scale[c] = math.Max(scale[c], math.Abs(v))
		}
	}
	for c := range scale {
		if scale[c] == 0 {
			scale[c] = 1
		}
	}
	ata := make([][]float64, dim)
	for c := range ata {
		ata[c] = make([]float64, dim+1)
	}
	for i := range n {
		r := row(i)
		wi := 1.0
		if w != nil {
			wi = w[i]
		}
		for a := range dim {
			for b := range dim {
				ata[a][b] += wi * r[a] / scale[a] * r[b] / scale[b]
			}
			ata[a][dim] += wi * r[a] / scale[a] * y[i]
		}
	}
	b, ok := solve(ata)
	if !ok {
		return res, false
	}
	for c := range b {
		b[c] /= scale[c]
	}
	off := 0
	if withIntercept {
		res.intercept = b[0]
		off = 1
	}
	for c, j := range cols {
		res.slopes[j] = b[c+off]
		res.used[j] = true
	}
	var mean, ssTot, ssRes float64
	for _, v := range y {
		mean += v / float64(n)
	}
	for i := range n {
		pred := res.intercept
		for j := range k {
			pred += res.slopes[j] * x[i][j]
		}
		ssRes += (y[i] - pred) * (y[i] - pred)
		ssTot += (y[i] - mean) * (y[i] - mean)
	}
	res.rmse = math.Sqrt(ssRes / float64(n))
	if ssTot > 0 {
		r2 := 1 - ssRes/ssTot
		res.r2 = &r2
	}
	return res, true
}

// huberK is the tuning constant of Huber's weights: 95% efficiency when
// the residuals are Gaussian.
const huberK = 1.345

// robustWLSQ is wlsq made robust to outliers by iteratively reweighted
// least squares with Huber's weights: a point whose weighted residual
// exceeds huberK robust standard deviations (1.4826 · median absolute
// residual) counts with weight huberK·s/|r| instead of 1. A migration
// slowed down by a neighbour's load then pulls the fit much less. With
// fewer than 2·coefficients + 1 points there is no telling an outlier, and
// it returns the plain fit.
func robustWLSQ(x [][]float64, y, w []float64, withIntercept bool) (lsqResult, bool) {
	res, ok := wlsq(x, y, w, withIntercept)
	if !ok {
		return res, false
	}
	coef := 0
	if withIntercept {
		coef++
	}
	for _, u := range res.used {
		if u {
			coef++
		}
	}
	n := len(y)
	if n < 2*coef+1 {
		return res, true
	}
	base := w
	if base == nil {
		base = make([]float64, n)
		for i := range base {
			base[i] = 1
		}
	}
	resid := make([]float64, n)
	abs := make([]float64, n)
	rw := make([]float64, n)
	for iter := 0; iter < 50; iter++ {
		for i := range n {
			pred := res.intercept
			for j, v := range res.slopes {
				pred += v * x[i][j]
			}
			resid[i] = (y[i] - pred) * math.Sqrt(base[i])
			abs[i] = math.Abs(resid[i])
		}
		slices.Sort(abs)
		med := abs[n/2]
		if n%2 == 0 {
			med = (abs[n/2-1] + abs[n/2]) / 2
		}
		sc := 1.4826 * med
		if !(sc > 0) {
			break
		}
		for i := range n {
			rw[i] = base[i]
			if a := math.Abs(resid[i]); a > huberK*sc {
				rw[i] *= huberK * sc / a
			}
		}
		next, ok := wlsq(x, y, rw, withIntercept)
		if !ok {
			break
		}
		done := math.Abs(next.intercept-res.intercept) <= 1e-9*(1+math.Abs(res.intercept))
		for j := range next.slopes {
			done = done && math.Abs(next.slopes[j]-res.slopes[j]) <= 1e-9*(1+math.Abs(res.slopes[j]))
		}
		res = next
		if done {
			break
		}
	}
	return res, true
}

// solve solves the augmented system m (dim × dim+1) by Gaussian elimination
// with partial pivoting.
func solve(m [][]float64) ([]float64, bool) {
	dim := len(m)
	var big float64
	for r := range dim {
		big = math.Max(big, math.Abs(m[r][r]))
	}
	for c := range dim {
		piv := c
		for r := c + 1; r < dim; r++ {
			if math.Abs(m[r][c]) > math.Abs(m[piv][c]) {
				piv = r
			}
		}
		if math.Abs(m[piv][c]) <= 1e-12*big {
			return nil, false
		}
		m[c], m[piv] = m[piv], m[c]
		for r := c + 1; r < dim; r++ {
			f := m[r][c] / m[c][c]
			for k := c; k <= dim; k++ {
				m[r][k] -= f * m[c][k]
			}
		}
	}
	x := make([]float64, dim)
	for r := dim - 1; r >= 0; r-- {
		s := m[r][dim]
		for k := r + 1; k < dim; k++ {
			s -= m[r][k] * x[k]
		}
		x[r] = s / m[r][r]
	}
	return x, true
}
