package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/units"
)

func init() {
	register(command{name: "image", summary: "local OCI images: 'image build', 'image ls', 'image import'", run: runImage})
}

const imageUsage = "usage: edgehop image build [--force] [--probe PATH] [--json] [-v] [probe|services|dprgen|all]\n" +
	"       edgehop image ls [--json]\n" +
	"       edgehop image import NAME PATH   (OCI layout directory, OCI archive or docker save tar)\n" +
	"every form takes --root DIR (env EDGEHOP_IMAGE_ROOT, default " + image.DefaultRoot + ")"

func imageRootFlag(fs *flag.FlagSet) *string {
	return fs.String("root", envOr("EDGEHOP_IMAGE_ROOT", image.DefaultRoot), "image cache directory (env EDGEHOP_IMAGE_ROOT)")
}

func runImage(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, imageUsage)
	}
	switch args[0] {
	case "build":
		return imageBuild(ctx, args[1:])
	case "ls", "list":
		return imageList(args[1:])
	case "import":
		return imageImport(ctx, args[1:])
	}
	return fmt.Errorf("%w: unknown image command %q\n%s", errUsage, args[0], imageUsage)
}

func imageBuild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	root := imageRootFlag(fs)
	force := fs.Bool("force", false, "rebuild even when the image is cached")
	probeBin := fs.String("probe", "", "static probe binary (default: 'probe' next to this executable)")
	mirror := fs.String("mirror", image.DefaultMirror, "Debian mirror for the services image")
	asJSON := fs.Bool("json", false, "print results as JSON")
	verbose := fs.Bool("v", false, "log build steps to stderr")
	fs.Usage = func() { fmt.Fprintln(fs.Output(), imageUsage); fs.PrintDefaults() }
	if err := parse(fs, args); err != nil {
		return err
	}
	names := append(image.Builtins(), image.Workloads()...)
	switch {
	case fs.NArg() > 1:
		return fmt.Errorf("%w: one of %s, all", errUsage, strings.Join(names, ", "))
	case fs.NArg() == 1 && fs.Arg(0) != "all":
		names = []string{fs.Arg(0)}
	}
	opts := image.BuildOptions{Root: *root, Force: *force, ProbeBinary: *probeBin, Mirror: *mirror, Logger: logger(*verbose)}
	var results []image.Result
	for _, n := range names {
		var res image.Result
		var err error
		if slices.Contains(image.Workloads(), n) {
			res, err = image.BuildWorkload(ctx, n, image.WorkloadOptions{Root: *root, Force: *force, Logger: opts.Logger})
		} else {
			res, err = image.Build(ctx, n, opts)
		}
		if err != nil {
			return err
		}
		results = append(results, res)
		if !*asJSON {
			what := "built"
			if res.Cached {
				what = "cached"
			}
			fmt.Printf("%-9s %s %s %s in %v\n", n, what, res.Digest, humanBytes(res.Size), res.Duration.Round(10*time.Millisecond))
		}
	}
	if *asJSON {
		return printJSON(results)
	}
	return nil
}

func imageList(args []string) error {
	fs := flag.NewFlagSet("image ls", flag.ContinueOnError)
	root := imageRootFlag(fs)
	asJSON := fs.Bool("json", false, "print as JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: image ls takes no arguments", errUsage)
	}
	infos, err := image.List(*root)
	if err != nil {
		return err
	}
	if *asJSON {
		if infos == nil {
			infos = []image.Info{}
		}
		return printJSON(infos)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDIGEST\tPLATFORM\tLAYERS\tSIZE\tCREATED")
	for _, i := range infos {
		created := "-" // the config does not say
		if !i.Created.IsZero() {
			created = i.Created.Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%.19s\t%s\t%d\t%s\t%s\n", i.Name, i.Digest, i.Platform, i.Layers, humanBytes(i.Size), created)
	}
	return tw.Flush()
}

func imageImport(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("image import", flag.ContinueOnError)
	root := imageRootFlag(fs)
	maxSize := fs.String("max-size", "8GiB", "refuse a source larger than this (as read: the file, decompressed, its files)")
	if err := parse(fs, args); err != nil {
		return err
	}
	limit, err := units.ParseSize(*maxSize)
	if err != nil || limit <= 0 {
		return fmt.Errorf("%w: --max-size %q: want a size such as 8GiB", errUsage, *maxSize)
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("%w: want NAME PATH\n%s", errUsage, imageUsage)
	}
	img, err := image.Import(ctx, *root, fs.Arg(0), fs.Arg(1), limit)
	if err != nil {
		return err
	}
	fmt.Printf("%s imported %s (%s)\n", img.Name(), img.Digest(), img.Platform())
	return nil
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
