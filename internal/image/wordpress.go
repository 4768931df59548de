package image

import v1 "github.com/google/go-containerregistry/pkg/v1"

// wordpressImage is CloudHopper's application (seed 004): WordPress on
// Apache with mod_php, and MariaDB, all from Debian's packages. One image
// holds both tiers; a deployment runs it twice, as two containers of one
// group:
//
//	edgehop run db  wordpress --group wp edgehop-mariadb
//	edgehop run web wordpress --group wp --after db --env WORDPRESS_DB_HOST=<db's IP> edgehop-wordpress
//
// The database listens on 3306 (user and database "wordpress", password
// "wordpress"), the web tier on 8080. Each runs as Debian runs it:
// mariadbd drops to user mysql itself, and Apache's master stays root
// while its prefork children run as www-data (a service of two users,
// which CRIU dumps through edgehop's gate library where root lacks
// CAP_SYS_RESOURCE). Nothing logs per request.
var wordpressImage = debianImage{
	name:    WordPress,
	version: "wordpress v1",
	packages: []string{"wordpress", "wordpress-theme-twentytwentythree", "apache2", "libapache2-mod-php",
		"php-mysql", "mariadb-server"},
	files: map[string]debianFile{
		"usr/local/bin/edgehop-mariadb":                       {0o755, wpMariaDBStart},
		"usr/local/bin/edgehop-wordpress":                     {0o755, wpApacheStart},
		"etc/mysql/mariadb.conf.d/60-edgehop.cnf":             {0o644, wpMariaDBConf},
		"etc/mysql/edgehop-init.sql":                          {0o644, wpMariaDBInit},
		"etc/apache2/ports.conf":                              {0o644, "Listen 8080\n"},
		"etc/apache2/sites-available/000-default.conf":        {0o644, wpSite},
		"etc/apache2/conf-available/edgehop.conf":             {0o644, wpApacheConf},
		"etc/apache2/mods-available/mpm_prefork.conf":         {0o644, wpPrefork},
		"etc/wordpress/config-default.php":                    {0o644, wpConfig},
		"var/lib/wordpress/wp-content/mu-plugins/edgehop.php": {0o644, wpPlugin},
	},
	commands: [][]string{
		{"a2disconf", "-q", "other-vhosts-access-log"},
		{"a2enconf", "-q", "edgehop"},
		{"install", "-d", "-o", "mysql", "-g", "mysql", "/run/mysqld"},
		{"install", "-d", "-o", "www-data", "-g", "www-data", "/run/apache2", "/var/lock/apache2"},
		{"chown", "-R", "www-data:www-data", "/var/log/apache2", "/var/lib/wordpress"},
	},
	config: v1.Config{ExposedPorts: map[string]struct{}{"8080/tcp": {}, "3306/tcp": {}}},
}

// wpMariaDBStart runs the database tier in the foreground as the
// container's only process (it switches to user mysql itself).
const wpMariaDBStart = `#!/bin/sh
exec mariadbd --user=mysql "$@"
`

// wpApacheStart runs Apache in the foreground with Debian's environment
// for apache2: its master as root, its children as APACHE_RUN_USER
// (www-data).
const wpApacheStart = `#!/bin/sh
set -e
. /etc/apache2/envvars
exec apache2 -DFOREGROUND "$@"
`

// wpMariaDBConf: reachable from the web tier's container; no reverse DNS
// (the testbed has none); synchronous I/O, as CRIU cannot checkpoint an
// io_uring (MariaDB 10.11 uses one for InnoDB's native AIO). The buffer
// pool may grow to 256 MiB: since 10.11.17 (MDEV-38671) MariaDB otherwise
// reserves 8 TiB of address space for it, and CRIU's lazy dump allocates
// an iovec per private page of the address space (32 GiB here), so
// post-copy and hybrid could not move the database ("loose-": an older
// MariaDB without the option ignores it).
const wpMariaDBConf = `[mysqld]
bind-address = 0.0.0.0
skip-name-resolve
innodb_use_native_aio = 0
loose-innodb_buffer_pool_size_max = 256M
init-file = /etc/mysql/edgehop-init.sql
`

// wpMariaDBInit runs at every start; it creates WordPress's database and
// user once.
const wpMariaDBInit = `CREATE DATABASE IF NOT EXISTS wordpress;
CREATE USER IF NOT EXISTS 'wordpress'@'%' IDENTIFIED BY 'wordpress';
GRANT ALL PRIVILEGES ON wordpress.* TO 'wordpress'@'%';
`

const wpSite = `<VirtualHost *:8080>
	DocumentRoot /usr/share/wordpress
	Alias /wp-content /var/lib/wordpress/wp-content
	<Directory /usr/share/wordpress>
		Options FollowSymLinks
		AllowOverride None
		Require all granted
	</Directory>
	<Directory /var/lib/wordpress/wp-content>
		Options FollowSymLinks
		Require all granted
	</Directory>
	PassEnv WORDPRESS_DB_HOST
</VirtualHost>
`

// wpApacheConf: Apache's errors stay in /var/log/apache2/error.log
// (www-data may not reopen the container's output).
const wpApacheConf = `ServerName wordpress
`

// wpPrefork bounds the web tier to 16 workers: two cores are saturated
// long before (PHP is CPU-bound), and every worker is memory and a
// process a checkpoint moves.
const wpPrefork = `<IfModule mpm_prefork_module>
	StartServers 4
	MinSpareServers 4
	MaxSpareServers 8
	ServerLimit 16
	MaxRequestWorkers 16
	MaxConnectionsPerChild 0
</IfModule>
`

// wpConfig is Debian's per-site configuration for every host name: the
// database is the container named by WORDPRESS_DB_HOST; WordPress makes
// no request of its own (no cron by loopback, no updates, no outside
// HTTP: the testbed has no internet).
const wpConfig = `<?php
define('DB_NAME', 'wordpress');
define('DB_USER', 'wordpress');
define('DB_PASSWORD', 'wordpress');
define('DB_HOST', getenv('WORDPRESS_DB_HOST') ?: '127.0.0.1');
define('WP_CONTENT_DIR', '/var/lib/wordpress/wp-content');
define('DISABLE_WP_CRON', true);
define('AUTOMATIC_UPDATER_DISABLED', true);
define('WP_HTTP_BLOCK_EXTERNAL', true);
`

// wpPlugin lets the load generator write through the REST API as
// CloudHopper's siege did: HTTP Basic authentication (as WordPress's
// Basic-Auth plugin for API clients), comments from anonymous clients,
// and no flood or duplicate checks on them.
const wpPlugin = `<?php
/* edgehop: REST API clients of the CloudHopper benchmark. */
add_filter('determine_current_user', function ($user) {
	static $busy = false;
	if (!empty($user) || $busy || !isset($_SERVER['PHP_AUTH_USER'])) {
		return $user;
	}
	$busy = true;
	$u = wp_authenticate($_SERVER['PHP_AUTH_USER'], $_SERVER['PHP_AUTH_PW'] ?? '');
	$busy = false;
	return is_wp_error($u) ? $user : $u->ID;
}, 20);
add_filter('rest_allow_anonymous_comments', '__return_true');
add_filter('wp_is_comment_flood', '__return_false', 99);
add_filter('duplicate_comment_id', '__return_false');
`
